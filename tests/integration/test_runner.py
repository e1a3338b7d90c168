"""The runner inside real jobs: real processes started from ``build_launch``'s plan, real
TensorFlow (tensorflow-cpu), and a small engine-side listener on a real socket.

The scripts check for themselves what they see (dtype policy, threads, XLA, environment) and
write it to files; the tests compare those with what was asked, not only with the runner's report.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Listener
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest

from trayapp.jobs.options import JobSpec, MemoryOptions
from trayapp.jobs.plan import build_launch
from trayapp.runner import protocol

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts" / "runner"
JOB_TIMEOUT = 120


class TestEngine:
    """The engine's side of one job channel: accepts the runner, collects its messages."""

    __test__ = False

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="hr-")  # short: AF_UNIX paths are limited
        self.address = os.path.join(self.folder, "job.sock")
        self.key = secrets.token_bytes(32)
        self.keyfile = os.path.join(self.folder, "key")
        with open(self.keyfile, "wb") as f:
            f.write(self.key)
        os.chmod(self.keyfile, 0o600)
        self.listener = Listener(self.address, family="AF_UNIX", authkey=self.key)
        self.messages: queue.Queue[Dict[str, Any]] = queue.Queue()
        self.seen: List[Dict[str, Any]] = []
        self.conn: Any = None
        self.connections = 0
        self._closed = False
        self._accepting = threading.Event()
        self._accepting.set()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            self._accepting.wait()
            try:
                conn = self.listener.accept()
            except OSError:
                return
            self.conn = conn
            self.connections += 1
            self._read(conn)

    def _read(self, conn: Any) -> None:
        while True:
            try:
                data = conn.recv_bytes()
            except (EOFError, OSError):
                return
            self.messages.put(protocol.decode(data, protocol.JOB_MESSAGES))

    def send(self, kind: str) -> None:
        self.conn.send_bytes(protocol.encode(protocol.make(kind)))

    def drop(self) -> None:
        """The engine goes away: shut the runner's connection down (closing the descriptor
        alone would not wake the reader blocked on it)."""
        with socket.fromfd(self.conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.shutdown(socket.SHUT_RDWR)

    def wait_for(
        self, match: Callable[[Dict[str, Any]], bool], timeout: float = 60.0
    ) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                kinds = [m["type"] for m in self.seen[-10:]]
                raise AssertionError(f"no such message within {timeout} s; last: {kinds}")
            try:
                message = self.messages.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(message)
            if match(message):
                return message

    def drain(self) -> List[Dict[str, Any]]:
        while True:
            try:
                self.seen.append(self.messages.get_nowait())
            except queue.Empty:
                return self.seen

    def close(self) -> None:
        self._closed = True
        try:
            self.listener.close()
        except OSError:
            pass
        shutil.rmtree(self.folder, ignore_errors=True)


def of(kind: str, **fields: Any) -> Callable[[Dict[str, Any]], bool]:
    return lambda m: m["type"] == kind and all(m.get(k) == v for k, v in fields.items())


@pytest.fixture
def engine():
    e = TestEngine()
    try:
        yield e
    finally:
        e.close()


class Job:
    """A job process started exactly as the launcher would, from the plan."""

    def __init__(self, spec: JobSpec, tmp_path: Path, engine: Optional[TestEngine] = None):
        self.plan = build_launch(
            spec,
            job_id="test-job",
            address=engine.address if engine else "",
            keyfile=engine.keyfile if engine else "",
        )
        self.out_path = tmp_path / f"job-{secrets.token_hex(3)}.log"
        self._out = open(self.out_path, "wb")
        self.process = subprocess.Popen(
            list(self.plan.argv),
            env=self.plan.env,
            cwd=self.plan.cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait(self, timeout: float = JOB_TIMEOUT) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            self._out.close()

    @property
    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._out.close()


@pytest.fixture
def jobs():
    started: List[Job] = []
    yield started
    for job in started:
        job.kill()


def start(jobs: List[Job], spec: JobSpec, tmp_path: Path, engine: Optional[TestEngine] = None):
    job = Job(spec, tmp_path, engine)
    jobs.append(job)
    return job


def lines(path: Path) -> List[str]:
    return path.read_text().split() if path.exists() else []


# ---------------------------------------------------------------------------------------------
# Real TensorFlow jobs


@pytest.mark.tensorflow
def test_options_apply_inside_tensorflow_and_progress_reaches_the_engine(tmp_path, engine, jobs):
    out = tmp_path / "report"
    spec = JobSpec(
        script=str(SCRIPTS / "fit_job.py"),
        args=(str(out), "--epochs", "3", "--fits", "2", "--exit", "3"),
        python=sys.executable,
        options=MemoryOptions(
            cpu_only=True, precision="mixed_bfloat16", xla=True, intra_threads=2, inter_threads=1
        ),
        checkpoint_dir=str(tmp_path / "checkpoints"),
    )
    job = start(jobs, spec, tmp_path, engine)
    assert job.wait() == 3, job.output  # the script's own sys.exit code

    report = json.loads(Path(str(out) + ".json").read_text())
    assert report["dtype_policy"] == "mixed_bfloat16"
    assert (report["intra_threads"], report["inter_threads"]) == (2, 1)
    assert report["jit"] == "autoclustering"
    assert report["cuda_visible_devices"] == "-1"
    assert report["keyfile_in_environment"] is False
    assert report["name"] == "__main__"
    assert report["argv"][0] == str(SCRIPTS / "fit_job.py")
    assert report["argv"][1:] == list(spec.args)
    assert report["path0"] == str(SCRIPTS)
    # The script's own callback ran for every epoch of both fits, and training was complete.
    assert report["epochs_seen"] == [0, 1, 2, 0, 1, 2]
    assert report["iterations"] == 2 * 3 * report["steps_per_epoch"]

    bye = engine.wait_for(of("bye"))
    assert (bye["reason"], bye["exit_code"]) == ("error", 3)
    messages = engine.drain()
    hellos = [m for m in messages if m["type"] == "hello"]
    last = hellos[-1]
    assert last["fit_hook"] == "installed"
    assert last["tf_version"] and last["keras_version"]
    assert last["build_info"]["is_cuda_build"] is False
    assert {"name": "/physical_device:CPU:0", "type": "CPU"} in last["tf_devices"]
    applied = {a["option"]: a for a in last["applied"]}
    assert applied["precision"]["value"] == "mixed_bfloat16"
    assert applied["xla"]["call"] == "tf.config.optimizer.set_jit"
    assert applied["intra_threads"]["value"] == 2 and applied["inter_threads"]["value"] == 1
    progress = [m for m in messages if m["type"] == "progress"]
    assert progress, "no progress message"
    assert {m["fit"] for m in progress} == {1, 2}
    final = [m for m in progress if m["fit"] == 2][-1]
    assert (final["epoch"], final["epochs"], final["step"], final["steps"]) == (3, 3, 10, 10)
    assert isinstance(final["logs"]["loss"], float)
    # Each fit() call keeps its own checkpoint, marked finished.
    for n in (1, 2):
        meta = json.loads(
            (tmp_path / "checkpoints" / f"fit-{n}" / "training_metadata.json").read_text()
        )
        assert meta["epoch"] == 3 and meta["headroom"]["finished"] is True
    assert not any(m["type"] == "note" and "no Keras fit()" in m["message"] for m in messages)


@pytest.mark.tensorflow
def test_pause_holds_training_park_checkpoints_and_resume_trains_only_the_rest(
    tmp_path, engine, jobs
):
    out = tmp_path / "run"
    epochs, steps = 5, 20
    spec = JobSpec(
        script=str(SCRIPTS / "fit_job.py"),
        args=(str(out), "--epochs", str(epochs), "--steps", str(steps), "--sleep", "0.03"),
        python=sys.executable,
        options=MemoryOptions(cpu_only=True),
        checkpoint_dir=str(tmp_path / "checkpoints"),
    )
    batches = Path(str(out) + ".batches")
    job = start(jobs, spec, tmp_path, engine)

    engine.wait_for(lambda m: m["type"] == "progress" and m["epoch"] >= 2)
    engine.send(protocol.PAUSE)
    paused = engine.wait_for(of("state", state="paused"))
    time.sleep(0.3)  # a batch that was already running may still end
    held = len(lines(batches))
    time.sleep(1.0)
    assert len(lines(batches)) == held, "training went on while paused"
    engine.send(protocol.RESUME)
    engine.wait_for(of("state", state="running"))
    deadline = time.monotonic() + 30
    while len(lines(batches)) <= held and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(lines(batches)) > held, "training did not go on after resume"
    assert paused["epoch"] >= 2

    # Park in the middle of an epoch: pause until the pause lands inside one, then park.
    engine.wait_for(lambda m: m["type"] == "progress" and m["epoch"] >= 3)
    for _ in range(20):
        engine.send(protocol.PAUSE)
        paused = engine.wait_for(of("state", state="paused"))
        if 0 < paused["step"] < steps:
            break
        engine.send(protocol.RESUME)
        engine.wait_for(of("state", state="running"))
        time.sleep(0.07)
    # A checkpoint on request, while paused, saves where the pause holds.
    engine.send(protocol.CHECKPOINT)
    engine.wait_for(of("state", state="checkpointing"))
    requested = engine.wait_for(of("checkpointed", reason="request"))
    assert (requested["epoch"] + 1, requested["step"]) == (paused["epoch"], paused["step"])
    engine.wait_for(of("state", state="paused"))
    engine.send(protocol.PARK)
    engine.wait_for(of("state", state="parking"))
    checkpoint = engine.wait_for(of("checkpointed", reason="park"))
    bye = engine.wait_for(of("bye"))
    assert job.wait() == protocol.PARK_EXIT_CODE, job.output
    assert (bye["reason"], bye["exit_code"]) == ("parked", protocol.PARK_EXIT_CODE)
    assert not Path(str(out) + ".after-fit").exists(), "the script went on after a park"
    folder = tmp_path / "checkpoints" / "fit-1"
    assert (folder / "latest.weights.h5").is_file()
    meta = json.loads((folder / "training_metadata.json").read_text())
    parked_epoch, done = meta["epoch"], meta["headroom"]["batches_done"]
    assert (parked_epoch, done) == (checkpoint["epoch"], checkpoint["step"])
    assert (parked_epoch + 1, done) == (paused["epoch"], paused["step"])
    assert parked_epoch >= 2 and 0 < done < steps  # parked in the middle of an epoch

    # Relaunch with resume (no engine this time: the job runs without a channel).
    Path(str(out) + ".epochs").unlink()
    resumed = start(jobs, JobSpec(**{**spec.__dict__, "resume": True}), tmp_path)
    assert resumed.wait() == 0, resumed.output
    report = json.loads(Path(str(out) + ".json").read_text())
    assert report["epochs_seen"] == list(range(parked_epoch, epochs))
    # Nothing trained twice, nothing lost: the optimizer made exactly one step per batch.
    assert report["iterations"] == epochs * report["steps_per_epoch"]


@pytest.mark.tensorflow
def test_stop_checkpoints_ends_training_and_skips_the_rest_of_the_script(tmp_path, engine, jobs):
    out = tmp_path / "run"
    spec = JobSpec(
        script=str(SCRIPTS / "fit_job.py"),
        args=(str(out), "--epochs", "50", "--steps", "20", "--sleep", "0.01"),
        python=sys.executable,
        options=MemoryOptions(cpu_only=True),
        checkpoint_dir=str(tmp_path / "checkpoints"),
        checkpoint_every_steps=7,
    )
    job = start(jobs, spec, tmp_path, engine)
    engine.wait_for(lambda m: m["type"] == "progress" and m["epoch"] >= 2)
    engine.send(protocol.STOP)
    engine.wait_for(of("state", state="stopping"))
    saved = engine.wait_for(of("checkpointed", reason="stop"))
    bye = engine.wait_for(of("bye"))
    assert job.wait() == protocol.STOP_EXIT_CODE, job.output
    assert (bye["reason"], bye["exit_code"]) == ("stopped", protocol.STOP_EXIT_CODE)
    assert not Path(str(out) + ".after-fit").exists(), "the script went on after a stop"
    assert not Path(str(out) + ".json").exists()
    messages = engine.drain()
    intervals = [m for m in messages if m["type"] == "checkpointed" and m["reason"] == "interval"]
    assert intervals and all(0 < m["step"] < 20 for m in intervals[:2])
    # Stopped is not finished: the checkpoint holds where training was, for a resume.
    meta = json.loads((tmp_path / "checkpoints" / "fit-1" / "training_metadata.json").read_text())
    assert (meta["epoch"], meta["headroom"]["batches_done"]) == (saved["epoch"], saved["step"])
    assert meta["headroom"]["finished"] is False and 1 <= meta["epoch"] < 50


@pytest.mark.tensorflow
def test_a_custom_training_loop_runs_and_gets_the_no_fit_note(tmp_path, engine, jobs):
    spec = JobSpec(
        script=str(SCRIPTS / "custom_loop.py"),
        python=sys.executable,
        options=MemoryOptions(cpu_only=True, intra_threads=1),
    )
    job = start(jobs, spec, tmp_path, engine)
    assert job.wait() == 0, job.output
    assert "custom loop done" in job.output
    note = engine.wait_for(of("note"))
    assert note["message"] == "no Keras fit() seen: progress is not available"
    assert engine.wait_for(of("bye"))["exit_code"] == 0
    hello = [m for m in engine.seen if m["type"] == "hello"][-1]
    assert hello["tf_imported"] is True


# ---------------------------------------------------------------------------------------------
# Plain Python: fast


def plain(mode: str, *args: str, **spec: Any) -> JobSpec:
    return JobSpec(
        script=str(SCRIPTS / "plain.py"), args=(mode, *args), python=sys.executable, **spec
    )


@pytest.mark.parametrize(
    "mode, args, code, printed",
    [
        ("exit", ("0",), 0, None),
        ("exit", ("7",), 7, None),
        ("message", (), 1, "a message from the script"),
        ("raise", (), 1, "ValueError: raised by the script"),
    ],
)
def test_exit_status_and_output_are_the_scripts(tmp_path, engine, jobs, mode, args, code, printed):
    job = start(jobs, plain(mode, *args), tmp_path, engine)
    assert job.wait() == code
    if printed:
        assert printed in job.output
    assert engine.wait_for(of("bye"))["exit_code"] == code


def test_a_traceback_shows_the_scripts_frames_only(tmp_path, jobs):
    job = start(jobs, plain("raise"), tmp_path)
    assert job.wait() == 1
    text = job.output
    assert text.startswith("Traceback (most recent call last):"), text
    assert f'File "{SCRIPTS / "plain.py"}"' in text
    assert "in outer" in text and "in inner" in text
    for runner_part in ("bootstrap.py", "runpy", "_headroom_runner", "job.py"):
        assert runner_part not in text


def test_a_syntax_error_exits_1_with_pythons_message(tmp_path, jobs):
    script = tmp_path / "broken.py"
    script.write_text("print('never')\ndef broken(:\n    pass\n")
    job = start(jobs, JobSpec(script=str(script), python=sys.executable), tmp_path)
    assert job.wait() == 1
    text = job.output
    assert f'File "{script}", line 2' in text
    assert "SyntaxError" in text
    assert "never" not in text and "bootstrap.py" not in text


def test_keyboard_interrupt_ends_the_job_as_python_does(tmp_path, jobs):
    job = start(jobs, plain("interrupt"), tmp_path)
    assert job.wait() == -signal.SIGINT
    assert "KeyboardInterrupt" in job.output


def test_the_script_sees_what_python_script_py_shows(tmp_path, engine, jobs):
    out = tmp_path / "env.json"
    job = start(jobs, plain("env", str(out), cwd=str(tmp_path)), tmp_path, engine)
    assert job.wait() == 0, job.output
    seen = json.loads(out.read_text())
    assert seen["name"] == "__main__"
    assert seen["file"] == str(SCRIPTS / "plain.py")
    assert seen["argv"] == [str(SCRIPTS / "plain.py"), "env", str(out)]
    assert seen["path0"] == str(SCRIPTS)
    assert seen["keyfile_in_environment"] is False
    assert seen["unbuffered"] == "1"
    assert seen["tensorflow_loaded"] is False  # nothing asked for it: the runner left it alone
    hello = engine.wait_for(of("hello"))
    assert hello["job_id"] == "test-job" and hello["fit_hook"] == "waiting"


def test_the_scripts_modules_are_not_shadowed_by_the_runners(tmp_path, jobs):
    job = start(
        jobs, JobSpec(script=str(SCRIPTS / "shadow" / "main.py"), python=sys.executable), tmp_path
    )
    assert job.wait() == 0, job.output
    assert "the script's own protocol module" in job.output


def test_the_job_keeps_running_when_the_engine_goes_away_and_says_hello_again(
    tmp_path, engine, jobs
):
    job = start(jobs, plain("tick", "3"), tmp_path, engine)
    engine.wait_for(of("hello"))
    engine.drop()
    engine.wait_for(of("hello"), timeout=20)  # reconnected by itself
    assert engine.connections == 2
    assert job.wait() == 0
    assert engine.wait_for(of("bye"))["exit_code"] == 0
    assert job.output.count("tick") >= 20  # it ticked on throughout


def test_without_an_address_the_job_runs_alone(tmp_path, jobs):
    out = tmp_path / "env.json"
    job = start(jobs, plain("env", str(out), options=MemoryOptions(cpu_only=True)), tmp_path)
    assert job.wait() == 0, job.output
    assert json.loads(out.read_text())["cuda_visible_devices"] == "-1"


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A Python without TensorFlow: a fresh venv without packages."""
    folder = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120
    )
    python = folder / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import tensorflow"], capture_output=True)
    if probe.returncode == 0:  # pragma: no cover - a system site with TensorFlow
        pytest.skip("the bare venv sees a TensorFlow")
    return str(python)


def test_an_option_needing_tensorflow_without_it_is_one_clear_line(
    tmp_path, engine, jobs, bare_python
):
    spec = JobSpec(
        script=str(SCRIPTS / "plain.py"),
        args=("exit", "0"),
        python=bare_python,
        options=MemoryOptions(xla=True, intra_threads=2),
    )
    job = start(jobs, spec, tmp_path, engine)
    assert job.wait() == protocol.NO_TENSORFLOW_EXIT_CODE
    text = job.output.strip()
    assert len(text.splitlines()) == 1, text
    assert text.startswith("headroom: --xla, --threads needs TensorFlow, which is not installed")
    assert "Traceback" not in text
    bye = engine.wait_for(of("bye"))
    assert bye["exit_code"] == protocol.NO_TENSORFLOW_EXIT_CODE


def test_env_only_options_apply_without_tensorflow(tmp_path, jobs, bare_python):
    out = tmp_path / "env.json"
    spec = JobSpec(
        script=str(SCRIPTS / "plain.py"),
        args=("env", str(out)),
        python=bare_python,
        options=MemoryOptions(gpus=(1,), allocator="cuda_malloc_async"),
    )
    job = start(jobs, spec, tmp_path)
    assert job.wait() == 0, job.output
    assert json.loads(out.read_text())["cuda_visible_devices"] == "1"


@pytest.mark.tensorflow
def test_an_option_tensorflow_refuses_is_one_line(tmp_path):
    """TensorFlow refuses thread counts once it has started; the runner says so in one line."""
    code = (
        "import tensorflow as tf\n"
        "from trayapp.runner import tfoptions\n"
        "tf.constant(1.0) + 1\n"  # TensorFlow has started
        "options = dict(tfoptions.DEFAULTS, intra_threads=2)\n"
        "try:\n"
        "    tfoptions.apply_tensorflow(tf, options)\n"
        "except tfoptions.OptionError as e:\n"
        "    print('REFUSED', e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=JOB_TIMEOUT
    )
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("REFUSED")]
    assert line.startswith("REFUSED --threads: TensorFlow refused it: ")
