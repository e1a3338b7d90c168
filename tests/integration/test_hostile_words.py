"""A job's words reach the user through every view, and none of them is shown raw: a job named
with terminal escapes, a bell, a bidi override, a C1 control and markup (by ``--name``, or by the
file name of its script, as a cloned repository can have), and a job that sends such notes. Real
engine, real jobs, the real command line; the engine's log; the notification the tray would show.

The script's own output (``headroom logs``, ``headroom run``'s copy of it) is the script's, as
it would be on the terminal without Headroom: these jobs print nothing hostile of their own.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any, Dict, List

import pytest

from tests.conftest import REPO, headroom_cmd, run_cli, wait_for
from trayapp.config import Paths
from trayapp.text import one_line
from trayapp.ui.model import notice_for
from trayapp.vocab import EventKind as E

pytestmark = [pytest.mark.skipif(sys.platform == "win32", reason="a file name with ESC in it")]

JOBS = REPO / "tests" / "scripts" / "jobs"
WORDS = "\x1b]0;pwned\x07\x1b[2J\u202e\x9b<a href=x><img src=y>"
SCRIPT = "evil\x1b]0;pwned\x07\x1b[2J\u202e\x9b<img src=y>.py"
BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")


def raw(text: str, allowed: str = "\n") -> List[str]:
    """What in ``text`` a terminal would act on: C0 (but ``allowed``), DEL, C1, bidi controls,
    line and paragraph separators."""
    return sorted({repr(ch) for ch in text if ch not in allowed and (
        unicodedata.category(ch) in ("Cc", "Zl", "Zp") or ch in BIDI)})


def clean(what: str, text: str) -> str:
    assert raw(text) == [], f"{what} shows raw control characters:\n{text!r}"
    return text


def cli(*args: str) -> subprocess.CompletedProcess:
    r = run_cli(*args, timeout=60)
    clean(f"headroom {' '.join(args)} (stdout)", r.stdout)
    clean(f"headroom {' '.join(args)} (stderr)", r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def test_no_view_shows_a_jobs_words_raw(engine: Any, paths: Paths, tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    clone.mkdir()
    script = clone / SCRIPT
    shutil.copy(JOBS / "hostile_words.py", script)
    marker = tmp_path / "sent"
    # A job named by --name, followed by `headroom run` as a user would.
    run = subprocess.Popen(headroom_cmd("run", "--name", WORDS, str(JOBS / "ticker.py"), "0",
                                        "0.2"),
                           cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        with engine.client() as c:
            talker = c.job_start({"script": str(script), "args": [str(marker)]}).id
            named = wait_for(lambda: [j.id for j in c.jobs() if j.name == WORDS], 60,
                             "the job headroom run started")[0]
            wait_for(marker.exists, 60, "the hostile notes sent")
            events: List[Dict[str, Any]] = wait_for(
                lambda: [e for e in c.events(job=talker) if e.kind == E.JOB_SHRUNK], 30,
                "the job_shrunk event")
            record = wait_for(lambda: (lambda j: j if j.dropped_fields else None)(
                c.job_get(talker)), 30, "the forecast dropped")
        assert record.name == Path(SCRIPT).stem  # its name is its script's
        escaped_name = one_line(WORDS)

        jobs = cli("jobs").stdout
        assert escaped_name[:24] in jobs and one_line(Path(SCRIPT).stem)[:24] in jobs
        cli("jobs", "--json")
        status = cli("status").stdout
        job_lines = [line for line in status.splitlines() if line.startswith("Job ")]
        assert len(job_lines) == 2 and any(escaped_name in line for line in job_lines), status
        cli("status", "--json")
        assert escaped_name in cli("pause", named).stdout
        assert escaped_name in cli("resume", named).stdout
        cli("park", named)  # refused or done, either way in words
        cli("logs", talker)
        cli("logs", named, "--tail", "3")

        # The notes: kept escaped, and the shrunk one as its notification would read.
        notes = record.notes
        assert {n.level for n in notes} == {"info", "warn", "error"}
        for note in notes:
            clean("a note", note.message)
        (shrunk,) = events
        clean("the job_shrunk event", shrunk.message)
        notice = notice_for(shrunk)
        assert notice is not None
        clean("its notification", notice.message)
        assert "<" not in notice.message and "&lt;img src=y&gt;" in notice.message
        # The forecast no machine holds: dropped, counted, not kept.
        assert record.forecast is None and record.dropped_fields >= 1

        for job in (named, talker):
            cli("stop", job)
        out, err = run.communicate(timeout=60)
        clean("headroom run (stdout)", out)
        clean("headroom run (stderr)", err)
        assert escaped_name in err and run.returncode == 76, (run.returncode, err)
        assert escaped_name[:24] in cli("jobs", "--all").stdout
        with engine.client() as c:
            for ev in c.events():
                clean(f"the {ev.kind} event", ev.message)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    log = clean("engine.log", paths.log_file.read_text(encoding="utf-8"))
    assert escaped_name in log and "above the machine's RAM and swap" in log
    clean("the engine's stderr", engine.stderr)
    assert "Traceback" not in engine.stderr
