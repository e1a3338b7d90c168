"""config.toml against a real engine: bad files at start, hand edits while it runs (noticed,
reloaded, reported once, pushed), and saves through the control channel that never write over
an edit they have not seen."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, List, Optional

import pytest

from tests.conftest import REPO, EngineProcess, run_cli, wait_for
from trayapp.config import Paths
from trayapp.engine.client import EngineError, Subscription
from trayapp.engine.event_record import EngineEvent
from trayapp.jobs.options import JobSpec

SCRIPTS = REPO / "tests" / "scripts"

DEEP = "[guard]\nrules = " + "[" * 5000 + "]" * 5000 + "\n"


def write(path: Path, text: str) -> None:
    """A hand edit as an editor saves it: a new file put in place."""
    tmp = path.with_name(path.name + ".swp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def pushes(sub: Subscription, seconds: float) -> List[EngineEvent]:
    """The events pushed within ``seconds``, read as the tray reads them."""
    out: List[EngineEvent] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        msg = sub.get(timeout=0.2)
        event = EngineEvent.from_json(msg["data"]) if msg and msg.get("push") == "event" else None
        if event is not None:
            out.append(event)
    return out


def value(engine: EngineProcess, section: str, key: str) -> Any:
    with engine.client() as c:
        return c.config_get().section(section)[key]


@pytest.mark.parametrize("text,expect", [
    ("[guard]\nresume_available = 1e400\n",
     ["guard.resume_available", "using the default '20%'"]),
    (DEEP, ["cannot be read", "nested too deeply", "using the defaults"]),
])
def test_a_bad_file_at_start_names_the_problem_and_the_engine_runs_on_defaults(
        paths: Paths, start_engine: Callable[..., EngineProcess], text: str,
        expect: List[str]) -> None:
    paths.ensure()
    paths.config_file.write_text(text, encoding="utf-8")
    engine = start_engine()
    r = run_cli("status", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "engine running" in r.stdout
    line = [ln for ln in r.stdout.splitlines() if "config" in ln]
    assert len(line) == 1 and all(e in line[0] for e in expect), r.stdout
    r = run_cli("status", "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    problems = json.loads(r.stdout)["engine"]["config_problems"]
    assert len(problems) == 1 and all(e in problems[0] for e in expect)
    with engine.client() as c:
        cfg = c.config_get()
        events = c.events()
    assert cfg.value("guard.resume_available") == "20%"
    assert [e.kind for e in events].count("config_problem") == 1
    assert paths.config_file.read_text(encoding="utf-8") == text  # left as the user wrote it
    engine.stop()
    assert "Traceback" not in engine.stderr
    assert sum(expect[0] in ln for ln in engine.stderr.splitlines()) == 1, engine.stderr


def test_a_hand_edit_is_picked_up_and_pushed(paths: Paths,
                                             start_engine: Callable[..., EngineProcess]) -> None:
    paths.ensure()
    paths.config_file.write_text("[guard]\npause_available = \"8%\"\n# mine\n")
    engine = start_engine()
    with Subscription(paths) as sub:
        write(paths.config_file, "[guard]\npause_available = \"9%\"\n# mine\n")
        wait_for(lambda: value(engine, "guard", "pause_available") == "9%", 10,
                 "the engine to read the edit")
        events = pushes(sub, 1.5)
    changed = [e for e in events if e.kind == "config_changed"]
    assert len(changed) == 1, events
    assert "guard.pause_available = '9%'" in changed[0].message
    assert changed[0].data["names"] == ["guard.pause_available"]
    assert not [e for e in events if e.kind == "config_problem"]
    # The guard acts on it: its pause threshold is 9% of the memory now.
    with engine.client() as c:
        wait_for(lambda: (g := c.status().guard_json).get("thresholds", {}).get("pause_bytes")
                 == int(g["total_bytes"] * 9 / 100), 10, "the guard's new pause threshold")
    # An edit in place (same inode, same size, within the clock's tick) is seen too.
    with open(paths.config_file, "r+", encoding="utf-8") as f:
        f.seek(0)
        f.write("[guard]\npause_available = \"7%\"\n# mine\n")
    wait_for(lambda: value(engine, "guard", "pause_available") == "7%", 10,
             "the engine to read the edit in place")


def test_a_bad_edit_is_reported_once_and_the_guard_keeps_guarding(
        paths: Paths, start_engine: Callable[..., EngineProcess], tmp_path: Path) -> None:
    paths.ensure()
    paths.config_file.write_text("[guard]\nmode = \"act\"\nwarn_available = \"14%\"\n")
    engine = start_engine()
    trigger = tmp_path / "go"
    job_id: Optional[str] = None
    with engine.client(timeout=30) as c, Subscription(paths) as sub:
        try:
            # A bad value: that key's default, the others as written; said once.
            write(paths.config_file, "[guard]\nmode = \"act\"\nwarn_available = \"14%\"\n"
                                     "resume_available = 1e400\n")
            wait_for(lambda: any("guard.resume_available" in p
                                 for p in c.config_get().problems), 10, "the problem")
            events = pushes(sub, 3)
            problems = [e for e in events if e.kind == "config_problem"]
            assert len(problems) == 1, events
            assert "guard.resume_available" in problems[0].message
            assert "using the default '20%'" in problems[0].message
            assert problems[0].level == "warn"
            cfg = c.config_get().section("guard")
            assert cfg["resume_available"] == "20%" and cfg["warn_available"] == "14%"
            # A file that cannot be read at all: the settings in use stay; said once.
            write(paths.config_file, DEEP)
            wait_for(lambda: any("cannot be read" in p for p in c.config_get().problems), 10,
                     "the unreadable file to be noticed")
            events = pushes(sub, 3)
            problems = [e for e in events if e.kind == "config_problem"]
            assert len(problems) == 1 and "cannot be read" in problems[0].message, events
            assert c.config_get().value("guard.warn_available") == "14%"
            assert engine.proc.poll() is None
            # And the guard still acts: a hog past its budget is paused.
            job = c.job_start(JobSpec(script=str(SCRIPTS / "faults" / "quiet_hog.py"),
                                      args=(str(trigger), "600"), ram_budget_mb=250,
                                      cwd=str(tmp_path)).to_json())
            job_id = job.id
            wait_for(lambda: c.job_get(job_id).state == "running", 30, "the job to run")
            trigger.write_text("go")
            paused = wait_for(lambda: (j := c.job_get(job_id)).state == "paused" and j, 30,
                              "the guard to pause the hog at its budget")
            assert paused.paused_by == "guard"
            assert paused.rss_bytes < 400 * 2**20
        finally:
            if job_id is not None:
                try:
                    c.job_action(job_id, "kill")
                except EngineError:
                    pass
    assert paths.config_file.read_text(encoding="utf-8") == DEEP
    engine.stop()
    assert "Traceback" not in engine.stderr


def test_config_set_keeps_a_hand_edit_and_refuses_a_stale_version(
        paths: Paths, start_engine: Callable[..., EngineProcess]) -> None:
    paths.ensure()
    paths.config_file.write_text("[guard]\nwarn_available = \"15%\"\n")
    engine = start_engine()
    with engine.client() as c, Subscription(paths) as sub:
        seen = c.config_get().version
        assert seen
        # A hand edit, and at once (before the slow tick) a save of another key.
        write(paths.config_file, "[guard]\nwarn_available = \"15%\"\npause_available = \"9%\"\n")
        with pytest.raises(EngineError) as refused:
            c.request("config_set", name="guard.warn_available", value="16%", version=seen)
        assert refused.value.code == "conflict" and "changed" in str(refused.value)
        assert "16%" not in paths.config_file.read_text()
        # Without a version the save goes through and keeps the edit, which the engine now
        # applies and reports as a change of the file.
        answer = c.config_set("guard.warn_available", "16%")
        assert answer.value("guard.pause_available") == "9%"
        assert answer.value("guard.warn_available") == "16%"
        assert answer.version != seen
        text = paths.config_file.read_text()
        assert "pause_available = \"9%\"" in text and "16%" in text
        # With the current version, a save goes through.
        c.request("config_set", name="guard.mode", value="dry-run", version=answer.version)
        events = pushes(sub, 1.5)
    from_file = [e for e in events if e.kind == "config_changed"
                 and (e.data or {}).get("source") == "file"]
    assert any("guard.pause_available" in e.message for e in from_file), events
    with engine.client() as c:
        # Numbers past a float's range are refused with the reason, not an internal error:
        # the control channel's bounds turn them away before the setting sees them.
        for name in ("engine.sample_interval", "guard.pause_available"):
            with pytest.raises(EngineError) as bad:
                c.config_set(name, 10**400)
            assert bad.value.code == "bad_request" and "out of range" in str(bad.value), \
                bad.value
        with pytest.raises(EngineError) as bad:
            c.request("config_set", name="guard.mode", value="off", version=3)
        assert bad.value.code == "bad_request"
        assert c.config_get().value("guard.mode") == "dry-run"


pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
