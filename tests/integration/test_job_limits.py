"""``headroom run`` hands its job the resource limits of the shell it runs in, whoever started
the engine: with an engine already running (started without them), ``ulimit -v`` and
``ulimit -n`` in the user's shell reach the job; ``--dry-run`` says which differ from the
engine's. A real engine, a real shell, the real CLI."""

from __future__ import annotations

import resource
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, Tuple

import pytest

from tests.conftest import REPO, EngineProcess, headroom_cmd

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX resource limits")

PRINT_LIMITS = str(REPO / "tests" / "scripts" / "jobs" / "print_limits.py")
AS_KIB = 6_000_000  # ulimit -v: about 5.7 GiB, room for the CLI and the job's Python
NOFILE = 200


def in_shell(*args: str) -> subprocess.CompletedProcess:
    """``headroom ARGS`` in a shell that lowered its limits first, as a user would."""
    command = f"ulimit -v {AS_KIB}; ulimit -n {NOFILE}; exec {shlex.join(headroom_cmd(*args))}"
    return subprocess.run(["bash", "-c", command], cwd=str(REPO), capture_output=True,
                          text=True, timeout=120)


def limits(text: str) -> Dict[str, Tuple[int, int]]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].isupper() and parts[1].lstrip("-").isdigit():
            out[parts[0]] = (int(parts[1]), int(parts[2]))
    return out


def test_the_shells_limits_reach_the_job_of_an_engine_started_without_them(
        home: Path, start_engine: Callable[..., EngineProcess]) -> None:
    engine = start_engine()  # this process's limits: no ulimit -v
    assert resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY
    r = in_shell("run", "--name", "limits", PRINT_LIMITS)
    assert r.returncode == 0, r.stderr
    got = limits(r.stdout)
    assert got["AS"] == (AS_KIB * 1024, AS_KIB * 1024), r.stdout
    assert got["NOFILE"][0] == NOFILE, r.stdout
    # The engine itself keeps its own.
    with engine.client() as c:
        assert c.status().engine.rlimits["AS"] == [None, None]

    dry = in_shell("run", "--dry-run", PRINT_LIMITS)
    assert dry.returncode == 0, dry.stderr
    line = [x for x in dry.stdout.splitlines() if "Limit AS" in x]
    assert line and "5.7 GiB soft" in line[0] and "(the engine's: unlimited)" in line[0], \
        dry.stdout
    assert any("Limit NOFILE: 200 soft" in x for x in dry.stdout.splitlines())
    # What is the same as the engine's is not listed.
    listed = sorted(x.split()[1] for x in dry.stdout.splitlines() if x.strip().startswith("Limit "))
    assert listed == ["AS:", "NOFILE:"], dry.stdout


def test_a_spec_with_a_limit_that_is_not_one_is_refused_in_one_line(home: Path) -> None:
    from trayapp.jobs.options import JobSpec, SpecError

    for bad, said in [({"NOSUCH": [1, 1]}, "unknown limit"), ({"AS": [5, 1]}, "above the hard"),
                      ({"AS": [1]}, "a [soft, hard] pair"), ({"AS": [-1, None]}, "between 0"),
                      ({"AS": ["1", None]}, "a whole number"), ([1], "an object")]:
        with pytest.raises(SpecError) as e:
            JobSpec.from_json({"script": "t.py", "rlimits": bad})
        assert said in str(e.value) and "\n" not in str(e.value)
    spec = JobSpec.from_json({"script": "t.py", "rlimits": {"AS": [1 << 30, None],
                                                            "CPU": [None, None]}})
    assert spec.rlimits == (("AS", 1 << 30, None), ("CPU", None, None))
    assert JobSpec.from_json(spec.to_json()) == spec
