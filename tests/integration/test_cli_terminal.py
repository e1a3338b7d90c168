"""``headroom run`` of a script that draws Keras's progress bar (verbose=1), in a real terminal
(tmux): Headroom's lines never land inside a line of Keras's, a pause in the middle of an epoch
included; and ``headroom logs`` / ``attach`` / ``resume --follow`` on real jobs."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, List

import pytest

from tests.conftest import REPO, headroom_cmd, run_cli, wait_for

SCRIPTS = REPO / "tests" / "scripts" / "jobs"
CONFIG = '[guard]\nmode = "off"\n\n[engine]\nidle_exit_seconds = 5.0\n'
# One line of Keras's bar as a terminal shows it: "12/30 ━━━━━━ 1s 55ms/step - accuracy: 0.5 -
# loss: 0.69", nothing before it and nothing after its last metric.
BAR = re.compile(r"^ *\d+/\d+ ━+ \d+s( \d+m?s/step)?( - [a-z_]+: \d+\.\d+(e-?\d+)?)+ *$")

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="a POSIX terminal"),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed "
                       "(scripts/debian-packages.txt)"),
]


class Tmux:
    """A tmux server of the test's own (its socket in ``home``) with one 120x40 window."""

    def __init__(self, home: Path):
        self.socket = str(home / "tmux.sock")

    def __call__(self, *args: str) -> str:
        r = subprocess.run(["tmux", "-S", self.socket, *args], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0, r.stderr
        return r.stdout

    def start(self, command: str, env: dict) -> None:
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        self("new-session", "-d", "-x", "120", "-y", "40", "-s", "t",
             f"cd {shlex.quote(str(REPO))} && env {exports} {command}; echo EXIT=$?; "
             "sleep 600")

    def screen(self) -> List[str]:
        return self("capture-pane", "-p", "-J", "-S", "-", "-t", "t").splitlines()

    def wait_for(self, pattern: str, timeout: float) -> List[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.screen()
            if any(re.search(pattern, line) for line in lines):
                return lines
            time.sleep(0.2)
        raise AssertionError(f"{pattern!r} not on the screen in {timeout} s:\n" +
                             "\n".join(self.screen()))

    def kill(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True,
                       timeout=30)


@pytest.fixture
def tmux(home: Path) -> Iterator[Tmux]:
    (home / "config.toml").write_text(CONFIG)
    t = Tmux(home)
    yield t
    t.kill()


def check_lines(lines: List[str]) -> None:
    """Every line with Keras's bar is the bar alone; Headroom's lines start a line."""
    bars = [line for line in lines if "━" in line]
    assert bars, "\n".join(lines)
    for line in bars:
        assert BAR.match(line), f"a Keras line split: {line!r}\n" + "\n".join(lines)
    for line in lines:
        if "headroom:" in line:
            assert line.startswith("headroom:"), f"Headroom inside a line: {line!r}"
        assert "━" not in line or "headroom" not in line


def test_headroom_run_keeps_out_of_kerass_progress_bar(tmux: Tmux, home: Path) -> None:
    env = {"HEADROOM_HOME": str(home), "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    argv = headroom_cmd("run", str(SCRIPTS / "keras_verbose.py"), "3", "60", "0.05")
    tmux.start(" ".join(shlex.quote(a) for a in argv), env)
    seen: List[List[str]] = []
    lines = tmux.wait_for(r"^Epoch 2/3", 120)
    seen.append(lines)
    job_id = re.search(r"job (\w+) \(keras_verbose\) started", "\n".join(lines)).group(1)
    # A pause in the middle of the epoch: its message comes while the bar's line is open.
    time.sleep(1.0)
    assert run_cli("pause", job_id, timeout=30).returncode == 0
    seen.append(tmux.wait_for(r"^headroom: .*paused", 30))
    time.sleep(1.0)
    seen.append(tmux.screen())
    assert run_cli("resume", job_id, timeout=30).returncode == 0
    lines = tmux.wait_for(r"^EXIT=", 120)
    seen.append(lines)
    for snapshot in seen:
        check_lines([line for line in snapshot if line.strip()])
    assert "EXIT=0" in lines
    assert "training done" in lines
    # The bar redrew itself under the pause's message, to its end.
    assert sum(1 for line in lines if line.startswith("60/60 ━")) == 3


def test_logs_tail_and_follow_until_the_job_ends(home: Path, paths: Any) -> None:
    (home / "config.toml").write_text(CONFIG)
    ticker = str(SCRIPTS / "ticker.py")
    started = subprocess.Popen(headroom_cmd("run", "--name", "ticks", ticker, "60", "0.1"),
                               cwd=str(REPO), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = run_cli("logs", "ticks", "--tail", "2", timeout=30)
            if r.returncode == 0 and r.stdout.count("tick") == 2:
                break
            time.sleep(0.2)
        lines = r.stdout.splitlines()
        assert len(lines) == 2 and lines[0].startswith("tick ") and lines[1].startswith("tick ")
        # -f: what is there, then the rest as it comes, until the job ends; then exit 0.
        f = run_cli("logs", "-f", "ticks", timeout=60)
        assert f.returncode == 0, f.stderr
        assert f.stdout.splitlines()[:2] == ["tick 1", "tick 2"]
        assert f.stdout.endswith("tick 60\ndone\n")
        assert "Ctrl-C leaves it running" in f.stderr
        assert started.wait(30) == 0
    finally:
        if started.poll() is None:
            started.kill()
            started.wait(10)
    # An ended job's log, from the store.
    r = run_cli("logs", "ticks", "--tail", "1", timeout=30)
    assert (r.returncode, r.stdout) == (0, "done\n")
    r = run_cli("logs", "nosuchjob", timeout=30)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def runner_said(jobs: Any, state: str) -> bool:
    """Whether the runner of the one job listed has said ``state`` (it took a request)."""
    return len(jobs) == 1 and jobs[0].get("runner_state") == state


def test_attach_after_a_resume_follows_the_relaunched_job(home: Path, tmp_path: Path) -> None:
    (home / "config.toml").write_text(CONFIG)
    ckpt = tmp_path / "ckpt"
    err = tmp_path / "err"
    gate = tmp_path / "gate"  # the first epoch holds until the park has reached the runner
    with open(err, "w") as e:
        run = subprocess.Popen(
            headroom_cmd("run", "--name", "kt", "--checkpoint-dir", str(ckpt),
                         str(SCRIPTS / "keras_train.py"), "3", "30", "0.05", str(gate)),
            cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=e, text=True)
    try:
        wait_for(lambda: Path(f"{gate}.held").exists(), 120, "the job's first epoch")
        # park's answer waits for the job to get there: the gate opens meanwhile.
        park = subprocess.Popen(headroom_cmd("park", "kt"), cwd=str(REPO),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: runner_said(json.loads(run_cli("jobs", "--json").stdout), "parking"),
                 60, "the runner to take the park")
        gate.touch()
        assert park.wait(60) == 0
        assert run.wait(60) == 75
    finally:
        if run.poll() is None:
            run.kill()
    r = run_cli("jobs", timeout=30)
    assert "parked by you" in r.stdout and "exit 75" not in r.stdout
    follow = run_cli("resume", "--follow", "kt", timeout=120)
    assert follow.returncode == 0, follow.stderr
    assert follow.stdout.startswith("job ") and ": starting" in follow.stdout.splitlines()[0]
    assert "--- resumed from checkpoint" in follow.stdout
    assert "training done" in follow.stdout
    assert "finished" in follow.stderr and "Traceback" not in follow.stderr
    # attach on an ended job: its last lines and how it ended, with the exit status of run.
    again = run_cli("attach", "kt", timeout=60)
    assert again.returncode == 0 and "training done" in again.stdout


def test_ctrl_c_in_attach_leaves_the_job_running(home: Path, tmp_path: Path) -> None:
    (home / "config.toml").write_text(CONFIG)
    ticker = str(SCRIPTS / "ticker.py")
    run = subprocess.Popen(headroom_cmd("run", "--name", "long", ticker, "200", "0.1"),
                           cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while run_cli("logs", "long", timeout=30).stdout.count("tick") < 2:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        out = tmp_path / "attach.out"
        with open(out, "w") as o:
            at = subprocess.Popen(headroom_cmd("attach", "long"), cwd=str(REPO), stdout=o,
                                  stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 30
        while "following job" not in out.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        at.send_signal(2)
        assert at.wait(30) == 130
        text = out.read_text()
        assert "goes on running" in text and "Traceback" not in text
        r = run_cli("jobs", timeout=30)
        assert "long" in r.stdout and "running" in r.stdout
    finally:
        run.kill()
        run.wait(10)
        run_cli("stop", "long", timeout=30)
