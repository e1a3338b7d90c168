"""The commands of the terminal load neither Qt nor the engine's parts: ``headroom status`` starts
fast and runs where Qt cannot (a server without a desktop)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

PROBE = """
import contextlib, io, json, sys
from trayapp.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
heavy = ("PySide6", "pyqtgraph", "trayapp.ui", "trayapp.engine.service", "trayapp.jobs.manager")
print(json.dumps([code, sorted(m for m in sys.modules if m.startswith(heavy))]))
"""


def _loaded_by(home: Path, *argv: str) -> list:
    env = {**os.environ, "HEADROOM_HOME": str(home), "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", PROBE, *argv], env=env, capture_output=True,
                       text=True, timeout=120, cwd=str(REPO))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_status_and_jobs_load_no_qt_and_no_engine(home: Path) -> None:
    assert _loaded_by(home, "status") == [0, []]
    assert _loaded_by(home, "jobs") == [3, []]  # no engine: exit 3
    assert _loaded_by(home, "run", "--dry-run", str(REPO / "tests" / "scripts" / "jobs" /
                                                    "ticker.py"))[1] == []
