"""Out of memory in fit(): the runner trains on at half the micro-batch with twice the
accumulation, from where training stood, and the training is the one asked for.

Real jobs under the runner (real processes, real tensorflow-cpu): a real OOM under an
address-space limit on the job's interpreter, and OOMs raised by a callback at chosen batches,
so the weights can be compared with a fit that had none.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from tests.conftest import run_cli
from tests.integration.test_runner import JOB_TIMEOUT, Job, TestEngine, start
from trayapp.engine.client import EngineClient
from trayapp.jobs.options import JobSpec
from trayapp.runner import protocol

pytestmark = pytest.mark.tensorflow

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts" / "runner"
SHRINK_FIT = SCRIPTS / "shrink_fit.py"
OOM_FIT = SCRIPTS / "oom_fit.py"
# Measured on tensorflow-cpu: 16384 samples at batch 16384 always raise under this limit; with
# Adam, the runner's relaunched processes fail at micro-batches of 8192 down to 1024 and finish
# at 512.
AS_LIMIT = int(2.5 * 2**30)
OOM_SAMPLES = "16384"
# oneDNN's CPU allocator crashes (SIGSEGV) instead of reporting an allocation that fails under
# an address-space limit; TensorFlow's own allocator reports ResourceExhaustedError.
NO_ONEDNN = {"TF_ENABLE_ONEDNN_OPTS": "0"}


def plain(script: Path, *args: str, python: str = sys.executable,
          **env_vars: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **env_vars)
    return subprocess.run([python, str(script), *args], capture_output=True, text=True,
                          timeout=JOB_TIMEOUT, env=env)


@pytest.fixture
def engine() -> Iterator[TestEngine]:
    e = TestEngine()
    try:
        yield e
    finally:
        e.close()


@pytest.fixture
def jobs() -> Iterator[List[Job]]:
    started: List[Job] = []
    yield started
    for job in started:
        job.kill()


def report(path: Path) -> Dict[str, Any]:
    return json.loads(path.read_text())


def same_weights(a: Dict[str, Any], b: Dict[str, Any], tol: float = 1e-5) -> float:
    worst = 0.0
    for wa, wb in zip(a["weights"], b["weights"]):
        worst = max(worst, max(abs(p - q) for p, q in zip(wa, wb)))
    assert worst < tol, f"the weights differ by {worst}"
    return worst


def notes(engine: TestEngine) -> List[str]:
    return [m["message"] for m in engine.drain() if m["type"] == protocol.NOTE]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """The fit without any out-of-memory error, under plain python."""
    out = tmp_path_factory.mktemp("ref") / "report.json"
    r = plain(SHRINK_FIT, str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    return report(out)


def test_an_oom_mid_epoch_trains_on_at_half_the_batch_and_the_weights_are_the_same(
        tmp_path: Path, engine: TestEngine, jobs: List[Job], reference: Dict[str, Any]) -> None:
    out = tmp_path / "report.json"
    spec = JobSpec(fit_batch=False, script=str(SHRINK_FIT), args=(str(out), "--oom", "2:4"),
                   python=sys.executable)
    job = start(jobs, spec, tmp_path, engine)
    assert job.wait() == 0, job.output[-3000:]
    got = report(out)
    same_weights(reference, got)
    assert got["updates"] == reference["updates"] == 48  # 3 epochs of 16 updates
    assert got["accumulation"] == 2
    assert got["epochs"] == [0, 1, 2] and len(got["loss"]) == 3
    said = notes(engine)
    assert any("out of memory at epoch 2, batch 4" in n and "micro-batches of 16 x 2" in n
               and "the same training" in n for n in said), said
    # Progress counts the user's batches, not the micro-batches.
    progress = [m for m in engine.seen if m["type"] == protocol.PROGRESS]
    assert progress and all(m["steps"] == 16 for m in progress if m.get("steps")), progress[-3:]


def test_ooms_again_halve_again_down_to_the_floor(tmp_path: Path, engine: TestEngine,
                                                  jobs: List[Job],
                                                  reference: Dict[str, Any]) -> None:
    out = tmp_path / "report.json"
    spec = JobSpec(fit_batch=False, script=str(SHRINK_FIT), args=(str(out), "--oom", "1:2",
                   "--oom", "2:5",
                                                 "--above", "8"),
                   python=sys.executable, min_batch=8)
    job = start(jobs, spec, tmp_path, engine)
    assert job.wait() == 0, job.output[-3000:]
    got = report(out)
    same_weights(reference, got)
    assert got["accumulation"] == 4
    said = notes(engine)
    assert any("micro-batches of 16 x 2" in n for n in said), said
    assert any("micro-batches of 8 x 4" in n for n in said), said


def test_below_the_floor_it_parks_with_a_checkpoint_and_resumes_at_the_shrunk_size(
        tmp_path: Path, engine: TestEngine, jobs: List[Job], reference: Dict[str, Any]) -> None:
    out, once, ckpt = tmp_path / "report.json", tmp_path / "once", tmp_path / "ckpt"
    args = (str(out), "--oom", "2:4", "--oom", "3:4", "--above", "8", "--once", str(once))
    # The first OOM (epoch 2) halves to 16 x 2; the second, at the 4th micro-batch of epoch 3
    # (one update and a half done: the half is trained again), is below the floor.
    spec = JobSpec(fit_batch=False, script=str(SHRINK_FIT), args=args[:3] + ("--oom", "3:4",
                   "--above", "8"),
                   python=sys.executable, checkpoint_dir=str(ckpt), min_batch=16)
    job = start(jobs, spec, tmp_path, engine)
    assert job.wait() == protocol.PARK_EXIT_CODE, job.output[-3000:]
    said = notes(engine)
    assert any("smallest batch" in n and "parked with a checkpoint" in n for n in said), said
    metadata = json.loads((ckpt / "fit-1" / "training_metadata.json").read_text())
    assert metadata["headroom"]["accumulation"] == 2
    assert metadata["epoch"] == 2 and metadata["headroom"]["batches_done"] == 2  # 1 update x 2

    once.touch()  # the resumed job has the memory it needs
    resumed = JobSpec(fit_batch=False, script=str(SHRINK_FIT), args=args, python=sys.executable,
                      checkpoint_dir=str(ckpt), resume=True, min_batch=16)
    job = start(jobs, resumed, tmp_path, engine)
    assert job.wait() == 0, job.output[-3000:]
    got = report(out)
    assert got["accumulation"] == 2
    assert any("resumed at micro-batches of 16 x 2" in n for n in notes(engine)), engine.seen[-5:]
    same_weights(reference, got)


def test_on_oom_stop_fails_as_without_headroom(tmp_path: Path, engine: TestEngine,
                                               jobs: List[Job]) -> None:
    out = tmp_path / "report.json"
    spec = JobSpec(fit_batch=False, script=str(SHRINK_FIT), args=(str(out), "--oom", "1:3"),
                   python=sys.executable, on_oom="stop")
    job = start(jobs, spec, tmp_path, engine)
    assert job.wait() == 1
    assert "ResourceExhaustedError" in job.output
    assert not out.exists()


keras2 = pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None,
                            reason="Keras 2 (tf_keras) is not installed")


@keras2
def test_keras2_is_not_shrunk_unless_asked_for_a_smaller_batch(tmp_path: Path, engine: TestEngine,
                                                               jobs: List[Job]) -> None:
    out = tmp_path / "report.json"
    spec = JobSpec(fit_batch=False, script=str(SHRINK_FIT), args=(str(out), "--oom", "2:3",
                   "--keras2"),
                   python=sys.executable)
    job = start(jobs, spec, tmp_path, engine)
    assert job.wait() == 1
    assert "ResourceExhaustedError" in job.output
    assert any("not shrunk: Keras 2 has no gradient accumulation: a smaller batch would change "
               "the training (--on-oom smaller-batch allows it)" in n for n in notes(engine)), \
        engine.seen[-5:]
    # Asked for: half the batch, no accumulation; from where training stood, to the end.
    out2 = tmp_path / "smaller.json"
    spec = JobSpec(fit_batch=False, script=str(SHRINK_FIT), args=(str(out2), "--oom", "2:3",
                   "--keras2"),
                   python=sys.executable, on_oom="smaller-batch")
    job = start(jobs, spec, tmp_path, engine)
    assert job.wait() == 0, job.output
    said = [n for n in notes(engine) if "training batches of 16 instead of 32" in n]
    assert said and "this changes the training" in said[0], engine.seen[-5:]
    got = json.loads(out2.read_text())
    # 16 updates in epoch 1; in epoch 2, 2 at batch 32 and the other 448 samples at 16 (28);
    # epoch 3 at 16 (32).
    assert got["updates"] == 16 + 2 + 28 + 32
    assert got["epochs"] == [0, 1, 2] and got["accumulation"] is None


def limited_python(tmp_path: Path) -> Path:
    """An interpreter under an address-space limit (``ulimit -v``), as a wrapper script."""
    python = tmp_path / "python-limited"
    python.write_text(
        f"#!{sys.executable}\nimport os, resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({AS_LIMIT}, {AS_LIMIT}))\n"
        f"os.execv({sys.executable!r}, [{sys.executable!r}] + sys.argv[1:])\n")
    python.chmod(0o755)
    return python


def test_a_real_oom_under_an_address_space_limit_is_relaunched_smaller_and_finishes(
        tmp_path: Path, engine: TestEngine, jobs: List[Job]) -> None:
    """Adam, whose step does not fit under the limit: each out-of-memory error on the host is
    trained on in a fresh process at half the micro-batch (TensorFlow does not survive another
    failed allocation there: SIGABRT or SIGSEGV), never in the process that failed."""
    python = limited_python(tmp_path)
    out, plain_out = tmp_path / "report.json", tmp_path / "plain.json"
    args = (OOM_SAMPLES, "1", OOM_SAMPLES, "adam")
    # The same script under plain python, with the same limit: it fails cleanly.
    failed = plain(OOM_FIT, str(plain_out), *args, python=str(python), **NO_ONEDNN)
    assert failed.returncode == 1 and "ResourceExhaustedError" in failed.stderr, \
        failed.stderr[-2000:]
    assert not plain_out.exists()
    spec = JobSpec(fit_batch=False, script=str(OOM_FIT), args=(str(out),) + args,
                   python=str(python),
                   env=tuple(NO_ONEDNN.items()))
    job = start(jobs, spec, tmp_path, engine)
    code = job.wait(timeout=400)
    assert code == 0, (code, job.output[-3000:])  # never a signal
    got = report(out)
    assert got["updates"] == 1 and got["accumulation"] >= 8
    said = notes(engine)
    relaunched = [n for n in said if n.startswith("out of memory at epoch 1, batch 1")]
    assert len(relaunched) >= 3, said
    assert all("OOM when allocating tensor" in n and "an allocation failed on the host" in n
               and "relaunched in a fresh process" in n and "the same training" in n
               for n in relaunched), said
    k = got["accumulation"]
    assert f"micro-batches of {16384 // k} x {k}" in relaunched[-1]
    assert f"resumed at micro-batches of {16384 // k} x {k} (batch 16384, the same training)" \
        in said, said
    hellos = [m for m in engine.seen if m["type"] == protocol.HELLO]
    assert len({m["pid"] for m in hellos}) == 1 and len(hellos) > len(relaunched), \
        "the same process, saying hello again after each relaunch"


@pytest.mark.parametrize("folder", [True, False], ids=["checkpoint-folder", "no-folder"])
def test_an_oom_inside_the_optimizers_update_relaunches_from_the_last_checkpoint(
        tmp_path: Path, engine: TestEngine, jobs: List[Job], reference: Dict[str, Any],
        folder: bool) -> None:
    """The error in Adam's update (the first layer's kernel updated, the rest maybe): no
    training can go on from those weights, in place or from a checkpoint of them. The job is
    relaunched from its last checkpoint (the end of epoch 1), or from its start without a
    checkpoint folder, and trains what plain Keras trains, its History included."""
    out, once, ckpt = tmp_path / "report.json", tmp_path / "once", tmp_path / "ckpt"
    spec = JobSpec(fit_batch=False, script=str(SHRINK_FIT), python=sys.executable,
                   args=(str(out), "--oom-in-update", "20", "--once", str(once)),
                   checkpoint_dir=str(ckpt) if folder else None)
    job = start(jobs, spec, tmp_path, engine)
    assert job.wait() == 0, job.output[-3000:]
    assert once.exists()
    got = report(out)
    same_weights(reference, got)
    assert got["updates"] == reference["updates"] == 48 and got["accumulation"] == 2
    assert got["epochs"] == [0, 1, 2]
    assert got["loss"] == pytest.approx(reference["loss"], rel=1e-5)
    said = notes(engine)
    where = "from its last checkpoint" if folder else "from its start"
    assert any("out of memory at epoch 2, batch 4" in n and "in its update" in n and
               f"relaunched in a fresh process {where}, training micro-batches of 16 x 2" in n
               for n in said), said
    if not folder:
        assert not ckpt.exists()


# -- as a user sees it: headroom run, the job's record, the events ------------------------------


def test_headroom_run_shows_the_shrunk_batch_and_the_event(home: Path, paths: Any,
                                                           start_engine: Any) -> None:
    (home / "config.toml").write_text('[guard]\nmode = "off"\n')
    start_engine()
    out = home / "report.json"
    r = run_cli("run", "--no-fit-batch", "--name", "shrinks", "--python", sys.executable,
                str(SHRINK_FIT),
                str(out), "--oom", "2:4", timeout=JOB_TIMEOUT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "out of memory at epoch 2, batch 4" in r.stdout + r.stderr
    with EngineClient(paths) as c:
        (job,) = c.jobs(all=True)
        events = c.events(after_id=0)
    assert (job.batch, job.micro_batch, job.accumulation) == (32, 16, 2)
    assert job.steps == 16, "steps count the user's batches"
    shrink_events = [e for e in events if "micro-batches of 16 x 2" in e.message]
    assert shrink_events and shrink_events[0].job_id == job.id
    assert shrink_events[0].kind == "job_shrunk"  # its own kind: the tray notifies it
    listing = run_cli("jobs", "--all")
    assert "batch 32 = 16 x 2" in listing.stdout, listing.stdout


@pytest.mark.parametrize("folder", [True, False], ids=["checkpoint-folder", "no-folder"])
def test_an_oom_on_the_host_relaunches_from_where_training_stood(
        tmp_path: Path, engine: TestEngine, jobs: List[Job], reference: Dict[str, Any],
        folder: bool) -> None:
    """The host's allocation failed at batch 4 of epoch 2, the weights those of update 3: saved
    (without a checkpoint folder, in a private one, deleted as the job ends), and the fresh
    process trains on from there at 16 x 2."""
    out, once, ckpt, tmp = (tmp_path / "report.json", tmp_path / "once", tmp_path / "ckpt",
                            tmp_path / "tmp")
    tmp.mkdir()
    spec = JobSpec(fit_batch=False, script=str(SHRINK_FIT), python=sys.executable, env=(("TMPDIR",
                   str(tmp)),),
                   args=(str(out), "--oom", "2:4", "--host", "--once", str(once)),
                   checkpoint_dir=str(ckpt) if folder else None)
    job = start(jobs, spec, tmp_path, engine)
    assert job.wait() == 0, job.output[-3000:]
    got = report(out)
    same_weights(reference, got)
    assert got["updates"] == 48 and got["accumulation"] == 2
    assert got["epochs"] == [0, 1, 2]
    # Epochs 1 and 3 whole; epoch 2's loss is over the batches trained after the relaunch.
    assert [got["loss"][0], got["loss"][2]] == pytest.approx(
        [reference["loss"][0], reference["loss"][2]], rel=1e-5)
    said = notes(engine)
    assert any("out of memory at epoch 2, batch 4" in n and "allocation failed on the host" in n
               and "relaunched in a fresh process from where it stood (epoch 2, batch 4), "
                   "training micro-batches of 16 x 2" in n for n in said), said
    assert "resumed at micro-batches of 16 x 2 (batch 32, the same training)" in said
    if folder:
        metadata = json.loads((ckpt / "fit-1" / "training_metadata.json").read_text())
        assert metadata["headroom"]["finished"] and metadata["headroom"]["accumulation"] == 2
    else:
        assert not ckpt.exists() and list(tmp.iterdir()) == [], list(tmp.iterdir())


def test_headroom_run_follows_a_job_relaunched_in_a_fresh_process(
        home: Path, paths: Any, start_engine: Any, tmp_path: Path,
        reference: Dict[str, Any]) -> None:
    """Under a real engine: the relaunched process is the same job (its pid, its log, its
    record), which says hello again and finishes; headroom run follows it to its end."""
    (home / "config.toml").write_text('[guard]\nmode = "off"\n')
    start_engine()
    out, once = home / "report.json", tmp_path / "once"
    r = run_cli("run", "--no-fit-batch", "--name", "relaunched", "--python", sys.executable,
                str(SHRINK_FIT),
                str(out), "--oom-in-update", "20", "--once", str(once), timeout=JOB_TIMEOUT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "relaunched in a fresh process from its start" in r.stdout + r.stderr
    same_weights(reference, report(out))
    with EngineClient(paths) as c:
        (job,) = c.jobs(all=True)
        events = c.events(after_id=0)
    assert job.state == "finished" and job.exit_code == 0, job
    assert (job.batch, job.micro_batch, job.accumulation) == (32, 16, 2)
    shrunk = [e for e in events if "relaunched in a fresh process" in e.message]
    assert shrunk and shrunk[0].kind == "job_shrunk" and shrunk[0].job_id == job.id
    assert not [e for e in events if e.kind in ("job_failed", "job_lost",
                                                    "job_bad_message")], events


def test_a_pydataset_is_said_not_to_shrink_when_fit_starts(tmp_path: Path, engine: TestEngine,
                                                           jobs: List[Job]) -> None:
    spec = JobSpec(fit_batch=False, script=str(SCRIPTS / "pydataset_fit.py"), python=sys.executable)
    job = start(jobs, spec, tmp_path, engine)
    assert job.wait() == 0, job.output
    assert "trained 4" in job.output
    said = [n for n in notes(engine) if "PyDataset" in n]
    assert said == ["a Batches (PyDataset) makes its own batches: it cannot shrink; an "
                    "out-of-memory error ends the job"], engine.seen[-8:]
    progress = [m for m in engine.seen if m["type"] == protocol.PROGRESS]
    assert progress and progress[-1]["shrinkable"] is False
