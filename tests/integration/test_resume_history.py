"""fit() returns the History plain python would after a park or a stop and a resume from the
checkpoint: every epoch's number and logs (the earlier epochs' kept with the checkpoint), and the
epoch it resumed in with its metrics over the whole epoch (the metrics' totals and counts are
kept with a checkpoint saved inside an epoch). Real jobs on tensorflow-cpu, compared with the
same fit under plain python: the History equal, the weights within 1e-5."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from tests.integration.test_runner import Job, TestEngine, of, start
from tests.integration.test_shrink_oom import SHRINK_FIT, plain, same_weights
from trayapp.jobs.options import JobSpec
from trayapp.runner import protocol

pytestmark = pytest.mark.tensorflow


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


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    out = tmp_path_factory.mktemp("ref") / "report.json"
    r = plain(SHRINK_FIT, str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(out.read_text())


def wait_for_file(path: Path, job: Job, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert job.process.poll() is None, job.output[-3000:]
        assert time.monotonic() < deadline, f"{path} not written"
        time.sleep(0.05)


def same_history(want: Dict[str, Any], got: Dict[str, Any]) -> None:
    assert got["epochs"] == want["epochs"] == [0, 1, 2]
    assert sorted(got["history"]) == sorted(want["history"]) == ["loss", "mae"]
    for key, values in want["history"].items():
        assert got["history"][key] == pytest.approx(values, rel=1e-5), key


@pytest.mark.parametrize("how,smaller", [
    (protocol.PARK, None), (protocol.STOP, None), (protocol.PARK, 2)],
    ids=["park", "stop", "park-to-relaunch-smaller"])
def test_a_resumed_fit_returns_the_history_of_the_whole_training(
        tmp_path: Path, engine: TestEngine, jobs: List[Job], reference: Dict[str, Any],
        how: str, smaller: Optional[int]) -> None:
    out, gate, ckpt = tmp_path / "report.json", tmp_path / "gate", tmp_path / "ckpt"
    held = Path(str(out) + ".held")
    # Epoch 2 (of 3) holds as its 6th batch begins, until the request is in.
    spec = JobSpec(fit_batch=False, script=str(SHRINK_FIT), python=sys.executable,
                   checkpoint_dir=str(ckpt),
                   args=(str(out), "--hold", "2:6", "--gate", str(gate)))
    job = start(jobs, spec, tmp_path, engine)
    wait_for_file(held, job)
    fields = {"accumulation": smaller} if smaller else {}
    engine.conn.send_bytes(protocol.encode(protocol.make(how, **fields)))
    engine.wait_for(of("state", state="parking" if how == protocol.PARK else "stopping"))
    gate.touch()
    code = protocol.PARK_EXIT_CODE if how == protocol.PARK else protocol.STOP_EXIT_CODE
    assert job.wait() == code, job.output[-3000:]
    assert not out.exists(), "the script went on after fit()"
    metadata = json.loads((ckpt / "fit-1" / "training_metadata.json").read_text())
    extra = metadata["headroom"]
    k = smaller or 1
    assert (metadata["epoch"], extra["batches_done"], extra["accumulation"]) == (1, 5 * k, k)
    assert [e for e, _ in extra["history"]] == [0]
    assert extra["history"][0][1]["loss"] == pytest.approx(reference["history"]["loss"][0],
                                                           rel=1e-5)
    assert sorted(extra["metrics"]) == ["compile_metrics", "loss"]

    resumed = JobSpec(fit_batch=False, script=str(SHRINK_FIT), python=sys.executable,
                      checkpoint_dir=str(ckpt),
                      args=(str(out),), resume=True, accumulation=smaller)
    job = start(jobs, resumed, tmp_path, engine)
    assert job.wait() == 0, job.output[-3000:]
    got = json.loads(out.read_text())
    assert got["updates"] == reference["updates"] == 48
    assert got["accumulation"] == smaller
    same_weights(reference, got)
    same_history(reference, got)


def test_a_finished_fit_restored_returns_its_history_too(
        tmp_path: Path, engine: TestEngine, jobs: List[Job]) -> None:
    """Two fits, parked in the second: resumed, the first fit restores its weights and trains
    no more, and returns its History all the same."""
    ref_out = tmp_path / "plain.json"
    r = plain(SHRINK_FIT, str(ref_out), "--fits", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    want = json.loads(ref_out.read_text())
    out, gate, ckpt = tmp_path / "report.json", tmp_path / "gate", tmp_path / "ckpt"
    spec = JobSpec(fit_batch=False, script=str(SHRINK_FIT), python=sys.executable,
                   checkpoint_dir=str(ckpt),
                   args=(str(out), "--fits", "2", "--hold", "1:3", "--gate", str(gate)))
    job = start(jobs, spec, tmp_path, engine)
    wait_for_file(Path(str(out) + ".held"), job)
    engine.send(protocol.PARK)
    engine.wait_for(of("state", state="parking"))
    gate.touch()
    assert job.wait() == protocol.PARK_EXIT_CODE, job.output[-3000:]
    resumed = JobSpec(fit_batch=False, script=str(SHRINK_FIT), python=sys.executable,
                      checkpoint_dir=str(ckpt),
                      args=(str(out), "--fits", "2"), resume=True)
    job = start(jobs, resumed, tmp_path, engine)
    assert job.wait() == 0, job.output[-3000:]
    got = json.loads(out.read_text())
    same_weights(want, got)
    for mine, theirs in zip(got["fits"], want["fits"]):
        same_history(theirs, mine)
