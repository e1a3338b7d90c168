"""The job commands as a user runs them: ``headroom run|jobs|pause|resume|stop|doctor``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import venv
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import pytest

from tests.conftest import REPO, EngineProcess, headroom_cmd, run_cli
from trayapp.jobs.options import JobSpec
from trayapp.runner.protocol import NO_TENSORFLOW_EXIT_CODE, PARK_EXIT_CODE

SCRIPTS = REPO / "tests" / "scripts" / "jobs"
# Watch only, and an engine started by a command goes away soon after its job.
CONFIG = '[guard]\nmode = "off"\n\n[engine]\nidle_exit_seconds = 2.0\n'
DESIGN_JOB_KEYS = {"id", "name", "state", "pid", "rss_bytes", "vram_bytes", "epoch", "epochs",
                   "step", "steps", "started", "exit_code"}

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and sessions")


@pytest.fixture
def cli_home(home: Path, paths: Any) -> Iterator[Path]:
    """A state folder; an engine that a command started there is stopped at the end."""
    (home / "config.toml").write_text(CONFIG)
    yield home
    pid = None
    try:
        pid = int(paths.lock_file.read_text().strip() or 0)
    except (OSError, ValueError):
        pass
    if pid:
        try:
            proc = psutil.Process(pid)
            if "engine" in proc.cmdline():
                proc.terminate()
                proc.wait(10)
        except psutil.Error:
            pass


@pytest.fixture
def eng(cli_home: Path, start_engine: Callable[..., EngineProcess]) -> EngineProcess:
    return start_engine()


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


def script(name: str) -> str:
    return str(SCRIPTS / name)


def test_run_exits_with_the_scripts_status(cli_home: Path, paths: Any) -> None:
    assert not paths.key_file.exists()
    r = run_cli("run", script("exit_with.py"), "7", timeout=60)
    assert r.returncode == 7, r.stderr
    assert "about to exit with 7" in r.stdout
    assert "failed (exit status 7)" in r.stderr
    assert "Traceback" not in r.stderr
    assert paths.key_file.exists()  # the command started an engine

    r = run_cli("run", "--name", "fine", script("ticker.py"), "3", "0.01", timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "tick 1\ntick 2\ntick 3\ndone\n"
    assert "finished" in r.stderr


def test_the_job_sees_the_shells_environment(eng: EngineProcess) -> None:
    # The engine was started without this variable; the shell that runs the job has it.
    r = run_cli("run", script("print_env.py"), "HEADROOM_TEST_FROM_SHELL",
                env={"HEADROOM_TEST_FROM_SHELL": "conda-env-value"}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "HEADROOM_TEST_FROM_SHELL = conda-env-value" in r.stdout


def test_a_syntax_error_shows_its_traceback(cli_home: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("print('hello'\n")
    r = run_cli("run", str(broken), timeout=60)
    assert r.returncode == 1
    assert "SyntaxError" in r.stdout  # the job's own output, as it came
    # Its last lines again on stderr (stdout may go to a file), after the one-line verdict.
    assert "failed (exit status 1)" in r.stderr and "SyntaxError" in r.stderr


@pytest.mark.parametrize("argv, words", [
    (["run", "missing_script.py"], "script not found"),
    (["run", "--memory-growth", "--vram-limit", "1024", script("ticker.py")],
     "cannot be combined"),
    (["run", "--resume", script("ticker.py")], "--resume needs --checkpoint-dir"),
    (["run", "--gpu", "zero", script("ticker.py")], "--gpu"),
    (["run", "--cpu-only", "--gpu", "0", script("ticker.py")], "not allowed with"),
    (["run", "--cwd", "/no/such/folder", script("ticker.py")], "folder not found"),
])
def test_bad_input_is_one_line_and_starts_nothing(cli_home: Path, paths: Any, argv: list,
                                                  words: str) -> None:
    r = run_cli(*argv, timeout=30)
    assert r.returncode == 2
    assert words in one_line(r.stderr)
    assert r.stdout == ""
    assert not paths.key_file.exists()


def test_dry_run_prints_the_plan_without_an_engine(cli_home: Path, paths: Any) -> None:
    r = run_cli("run", "--dry-run", "--cpu-only", script("ticker.py"), "--", "5", timeout=30)
    assert r.returncode == 0, r.stderr
    assert "bootstrap.py" in r.stdout and script("ticker.py") in r.stdout
    assert "CUDA_VISIBLE_DEVICES=-1" in r.stdout
    assert not paths.key_file.exists()


def test_an_interpreter_without_tensorflow_is_named(cli_home: Path, tmp_path: Path) -> None:
    env = tmp_path / "plain-env"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    r = run_cli("run", "--python", str(python), "--memory-growth", script("ticker.py"), "1",
                timeout=60)
    assert r.returncode == NO_TENSORFLOW_EXIT_CODE, r.stderr
    both = r.stdout + r.stderr
    assert "--memory-growth needs TensorFlow, which is not installed for this Python" in both
    assert str(python) in both
    assert "Traceback" not in both


def test_jobs_lists_as_table_and_json(eng: EngineProcess) -> None:
    with eng.client() as c:
        job = c.job_start(JobSpec(script=script("ticker.py"), args=("0", "0.05"),
                                  cwd=str(REPO)).to_json())
        r = run_cli("jobs", "--json", timeout=30)
        assert r.returncode == 0, r.stderr
        listed = json.loads(r.stdout)
        assert isinstance(listed, list) and [j["id"] for j in listed] == [job.id]
        assert DESIGN_JOB_KEYS <= set(listed[0])
        assert listed[0]["state"] in ("starting", "running")

        r = run_cli("jobs", timeout=30)
        header, row = r.stdout.splitlines()
        assert header.split() == ["ID", "NAME", "STATE", "PROGRESS", "RAM", "VRAM", "STARTED",
                                  "PROTECTION"]
        assert row.startswith(job.id) and "ticker" in row

        c.job_action(job.id, "stop")
    r = run_cli("jobs", "--json", timeout=30)
    assert json.loads(r.stdout) == []
    r = run_cli("jobs", "--all", "--json", timeout=30)
    ended = json.loads(r.stdout)
    assert [(j["id"], j["state"]) for j in ended] == [(job.id, "stopped")]


def test_pause_resume_stop_commands(eng: EngineProcess) -> None:
    with eng.client() as c:
        job = c.job_start(JobSpec(script=script("ticker.py"), args=("0", "0.05"),
                                  name="counting", cwd=str(REPO)).to_json())
    jid = job.id
    r = run_cli("pause", "counting", timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"job {jid} (counting): paused (its processes suspended) by you\n"
    r = run_cli("resume", jid, timeout=30)
    assert r.stdout == f"job {jid} (counting): running\n"
    r = run_cli("park", jid, timeout=30)
    assert r.returncode == 2 and "parking would lose" in one_line(r.stderr)
    r = run_cli("stop", jid, timeout=30)
    assert r.returncode == 0 and r.stdout.startswith(f"job {jid} (counting): stopped")
    r = run_cli("stop", "nosuch", timeout=30)
    assert r.returncode == 2 and one_line(r.stderr) == "headroom: no job named nosuch"


def test_commands_without_an_engine_exit_3(cli_home: Path) -> None:
    for command in ("pause", "park", "stop"):
        r = run_cli(command, "abc", timeout=30)
        assert r.returncode == 3
        assert "no engine is running" in one_line(r.stderr)


def test_ctrl_c_stops_the_job_and_twice_stops_it_at_once(cli_home: Path,
                                                         tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    out, err = tmp_path / "out", tmp_path / "err"
    with open(out, "wb") as o, open(err, "wb") as e:
        cli = subprocess.Popen(headroom_cmd("run", script("stubborn.py"), str(pidfile)),
                               cwd=str(REPO), stdout=o, stderr=e, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        root, child = (int(x) for x in pidfile.read_text().split())
        cli.send_signal(signal.SIGINT)
        _wait_text(err, "Ctrl-C again", 10)
        time.sleep(0.5)
        assert psutil.pid_exists(root), "the job ignores SIGINT: only the kill may end it"
        cli.send_signal(signal.SIGINT)
        assert cli.wait(20) == 130
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(5)
    text = err.read_text()
    assert "stopping job" in text and "at once" in text and "Traceback" not in text
    # The engine reaps what it killed on its next ticks; give it a moment, no more.
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(p) for p in (root, child)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in (root, child):
        assert not psutil.pid_exists(pid)


def _wait_text(path: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in path.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {path.read_text()!r}")


def test_doctor_gives_a_verdict(cli_home: Path, tmp_path: Path) -> None:
    r = run_cli("doctor", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["python"]["tf_version"]  # this interpreter has TensorFlow
    assert report["verdict"] in ("ok", "warn")
    assert all({"name", "verdict", "detail"} <= set(c) for c in report["checks"])
    assert report["checks"][-1]["name"] == "Memory protection"

    env = tmp_path / "plain-env"
    venv.EnvBuilder(with_pip=False).create(env)
    r = run_cli("doctor", "--python", str(env / "bin" / "python"), timeout=120)
    assert r.returncode == 1
    assert "TensorFlow is not installed" in r.stdout
    r = run_cli("doctor", "--python", str(tmp_path / "nothing"), timeout=30)
    assert r.returncode == 2 and "not found" in one_line(r.stderr)


@pytest.mark.tensorflow
def test_ctrl_c_parks_a_keras_job_with_checkpoints(cli_home: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    out, err = tmp_path / "out", tmp_path / "err"
    with open(out, "wb") as o, open(err, "wb") as e:
        cli = subprocess.Popen(
            headroom_cmd("run", "--checkpoint-dir", str(ckpt), script("keras_train.py"),
                         "5", "40", "0.05"),
            cwd=str(REPO), stdout=o, stderr=e, stdin=subprocess.DEVNULL,
            env={**os.environ})
    try:
        _wait_text(err, "epoch 1/5", 60)  # a progress line
        cli.send_signal(signal.SIGINT)
        assert cli.wait(60) == PARK_EXIT_CODE
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(5)
    text = err.read_text()
    assert "parking job" in text
    job_id = text.split("headroom resume ")[1].split("'")[0]
    assert (ckpt / "fit-1" / "latest.weights.h5").is_file()
    r = run_cli("jobs", "--json", timeout=30)
    (parked,) = json.loads(r.stdout)
    assert parked["id"] == job_id and parked["state"] == "parked"
    assert "epoch-begin 1" in out.read_text()
