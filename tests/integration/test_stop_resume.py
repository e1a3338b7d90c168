"""Stop as a user gives it: the job ends after a checkpoint, the rest of its script does not run,
and ``headroom resume`` continues it from where it was; a new run on a folder that holds a
checkpoint needs ``--resume`` or ``--fresh``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import pytest

from tests.conftest import REPO, EngineProcess, headroom_cmd, run_cli, wait_for
from tests.integration.test_runner import Job, TestEngine, of
from trayapp.jobs.options import JobSpec, MemoryOptions
from trayapp.jobs.record import JobRecord
from trayapp.runner import protocol
from trayapp.runner.protocol import STOP_EXIT_CODE

FIT_JOB = str(REPO / "tests" / "scripts" / "runner" / "fit_job.py")
CONFIG = '[guard]\nmode = "off"\n'
EPOCHS, STEPS = 10, 10

pytestmark = [
    pytest.mark.tensorflow,
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and sessions"),
]


@pytest.fixture
def eng(home: Path, start_engine: Callable[..., EngineProcess]) -> EngineProcess:
    (home / "config.toml").write_text(CONFIG)
    return start_engine()


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


def epochs_begun(out: Path) -> List[int]:
    path = Path(str(out) + ".epochs")
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def metadata(ckpt: Path) -> Dict[str, Any]:
    return json.loads((ckpt / "fit-1" / "training_metadata.json").read_text())


def job_args(out: Path, epochs: int = EPOCHS) -> List[str]:
    return [FIT_JOB, str(out), "--epochs", str(epochs), "--steps", str(STEPS), "--sleep", "0.03"]


def start_run(*args: str, log: Path) -> subprocess.Popen:
    """``headroom run ARGS`` in the background, its stderr in ``log``."""
    with open(log, "wb") as err:
        return subprocess.Popen(headroom_cmd("run", "--cpu-only", *args), cwd=str(REPO),
                                stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)


def listed(eng: EngineProcess, all: bool = False) -> List[JobRecord]:
    with eng.client() as c:
        return c.jobs(all=all)


def job_state(eng: EngineProcess, job_id: str) -> JobRecord:
    with eng.client() as c:
        return c.job_get(job_id)


def test_stop_checkpoints_skips_the_rest_and_resume_continues(
        eng: EngineProcess, start_engine: Callable[..., EngineProcess], tmp_path: Path) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "run"
    gate = tmp_path / "gate"  # epoch 4 (index 3) holds at its first batch until the stop is in
    cli = start_run("--checkpoint-dir", str(ckpt), *job_args(out), "--hold-epoch", "3",
                    "--gate", str(gate), log=tmp_path / "run.err")
    try:
        job = wait_for(lambda: (listed(eng) or [None])[0], 60, "the job")
        jid = job.id
        wait_for(lambda: Path(str(out) + ".held").exists(), 120, "epoch 4")
        # stop's answer waits for the job to get there: the gate opens meanwhile.
        stop = subprocess.Popen(headroom_cmd("stop", jid), cwd=str(REPO),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: job_state(eng, jid).runner_state == "stopping", 60,
                 "the runner to take the stop")
        gate.touch()
        said = stop.communicate(timeout=60)[1]
        assert stop.returncode == 0, said
        code = cli.wait(60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(10)
    err = (tmp_path / "run.err").read_text()
    assert code == STOP_EXIT_CODE, err
    stopped = job_state(eng, jid)
    assert stopped.state == "stopped", stopped
    assert stopped.exit_code == STOP_EXIT_CODE
    assert f"headroom resume {jid}" in err  # it says how to go on
    # `headroom jobs` lists it (it can still be resumed), not only `headroom jobs --all`.
    shown = run_cli("jobs", timeout=60)
    assert shown.returncode == 0 and jid in shown.stdout and "stopped" in shown.stdout, shown
    assert not Path(str(out) + ".after-fit").exists(), "the script went on after the stop"
    meta = metadata(ckpt)
    begun = epochs_begun(out)
    assert meta["headroom"]["finished"] is False
    assert 3 <= meta["epoch"] < EPOCHS
    # The checkpoint holds the epoch reached: the one it stopped in (or the next one, when the
    # stop landed at the end of an epoch).
    assert meta["epoch"] in (begun[-1], begun[-1] + 1), (meta, begun)

    # A later engine knows the stopped job too (from its store).
    eng.stop()
    eng = start_engine()
    assert jid in run_cli("jobs", timeout=60).stdout  # from the store
    r = run_cli("resume", jid, timeout=60)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: job_state(eng, jid).state not in ("starting", "running", "stopping"),
             180, "the resumed job to end")
    done = job_state(eng, jid)
    assert (done.state, done.exit_code) == ("finished", 0), done
    assert Path(str(out) + ".after-fit").exists()
    resumed = epochs_begun(out)[len(begun):]
    assert resumed == list(range(meta["epoch"], EPOCHS)), resumed  # not from 0
    report = json.loads(Path(str(out) + ".json").read_text())
    # Nothing lost, nothing trained twice: one optimizer step per batch of the whole training.
    assert report["iterations"] == EPOCHS * STEPS
    assert metadata(ckpt)["headroom"]["finished"] is True
    assert jid not in run_cli("jobs", timeout=60).stdout  # finished: --all lists it

    # A new run on that folder must say which it wants.
    r = run_cli("run", "--cpu-only", "--checkpoint-dir", str(ckpt), *job_args(out), timeout=60)
    assert r.returncode == 2
    line = one_line(r.stderr)
    assert str(ckpt) in line and "--resume" in line and "--fresh" in line
    assert len(listed(eng, all=True)) == 1  # nothing started

    # Starting over deletes the old checkpoint's files and nothing else: a folder of the
    # user's that looks like one (fit-2023), and a file of theirs inside fit-1, are kept.
    (ckpt / "fit-2023").mkdir()
    (ckpt / "fit-2023" / "notes.txt").write_text("the user's own")
    (ckpt / "fit-1" / "mine.txt").write_text("the user's too")
    fresh = tmp_path / "fresh"
    r = run_cli("run", "--cpu-only", "--fresh", "--checkpoint-dir", str(ckpt),
                *job_args(fresh, epochs=2), timeout=180)
    assert r.returncode == 0, r.stderr
    assert epochs_begun(fresh) == [0, 1]  # from the start
    meta = metadata(ckpt)
    assert (meta["epoch"], meta["headroom"]["finished"]) == (2, True)
    assert (ckpt / "fit-2023" / "notes.txt").read_text() == "the user's own"
    assert (ckpt / "fit-1" / "mine.txt").read_text() == "the user's too"


def test_stop_without_a_checkpoint_folder_skips_the_rest_too(eng: EngineProcess,
                                                            tmp_path: Path) -> None:
    out = tmp_path / "run"
    cli = start_run(*job_args(out), log=tmp_path / "run.err")
    try:
        job = wait_for(lambda: (listed(eng) or [None])[0], 60, "the job")
        jid = job.id
        wait_for(lambda: (job_state(eng, jid).epoch or 0) >= 2, 120, "epoch 2")
        r = run_cli("stop", jid, timeout=60)
        assert r.returncode == 0, r.stderr
        code = cli.wait(60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(10)
    assert code == STOP_EXIT_CODE, (tmp_path / "run.err").read_text()
    stopped = job_state(eng, jid)
    assert (stopped.state, stopped.exit_code) == ("stopped", STOP_EXIT_CODE)
    assert not Path(str(out) + ".after-fit").exists(), "the script went on after the stop"
    assert len(epochs_begun(out)) < EPOCHS
    r = run_cli("resume", jid, timeout=30)
    assert r.returncode == 2
    assert "no checkpoint folder" in one_line(r.stderr)


@pytest.fixture
def channel() -> Iterator[TestEngine]:
    """The engine's end of a job's channel, to drive the runner by hand."""
    e = TestEngine()
    try:
        yield e
    finally:
        e.close()


def test_a_paused_job_that_is_stopped_saves_where_the_pause_holds(tmp_path: Path,
                                                                  channel: TestEngine) -> None:
    engine = channel
    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    spec = JobSpec(script=FIT_JOB, args=tuple(job_args(out)[1:]), python=sys.executable,
                   options=MemoryOptions(cpu_only=True), checkpoint_dir=str(ckpt))
    job = Job(spec, tmp_path, engine)
    try:
        _stop_while_paused(engine, job, out, ckpt)
    finally:
        job.kill()


def _stop_while_paused(engine: TestEngine, job: Job, out: Path, ckpt: Path) -> None:
    engine.wait_for(lambda m: m["type"] == "progress" and m["epoch"] >= 2)
    engine.send(protocol.PAUSE)
    paused = engine.wait_for(of("state", state="paused"))
    engine.send(protocol.STOP)
    engine.wait_for(of("state", state="stopping"))
    saved = engine.wait_for(of("checkpointed", reason="stop"))
    assert (saved["epoch"] + 1, saved["step"]) == (paused["epoch"], paused["step"])
    assert job.wait() == STOP_EXIT_CODE, job.output
    assert engine.wait_for(of("bye"))["reason"] == "stopped"
    assert not Path(str(out) + ".after-fit").exists()
    meta = metadata(ckpt)
    assert (meta["epoch"], meta["headroom"]["batches_done"]) == (saved["epoch"], saved["step"])
    assert meta["headroom"]["finished"] is False


def test_a_runner_that_answers_gets_the_time_to_reach_its_batch(eng: EngineProcess,
                                                               tmp_path: Path) -> None:
    # Batches of 7 s: longer than a runner that does not answer is given before SIGINT.
    ckpt, out = tmp_path / "ckpt", tmp_path / "run"
    with eng.client() as c:
        job = c.job_start(JobSpec(script=FIT_JOB, args=(str(out), "--epochs", "3", "--steps",
                                                        "3", "--sleep", "7"),
                                  python=sys.executable, cwd=str(REPO),
                                  options=MemoryOptions(cpu_only=True),
                                  checkpoint_dir=str(ckpt)).to_json())
    jid = job.id
    # Its first batch trained (and now in its 7 s): the stop waits for the second.
    wait_for(lambda: job_state(eng, jid).hooked and Path(str(out) + ".batches").exists(),
             120, "the first batch")
    with eng.client() as c:
        c.job_action(jid, "stop")
    done = wait_for(lambda: (lambda j: j if j.state == "stopped" else None)(
        job_state(eng, jid)), 60, "the stop")
    assert done.exit_code == STOP_EXIT_CODE, done  # ended by its runner, not by a signal
    assert not Path(str(out) + ".after-fit").exists()
    assert metadata(ckpt)["headroom"]["finished"] is False
