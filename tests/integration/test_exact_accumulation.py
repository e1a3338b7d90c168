"""Micro-batches train as the full batch does, on datasets whose size is not a multiple of the
batch: every batch of an epoch (its last, short one included) is one optimizer update with the
gradient of the whole batch. Real jobs under the runner on tensorflow-cpu, each case compared
with the same fit under plain python at the full batch: the updates (``optimizer.iterations``)
equal, the weights within 1e-5, the History equal."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from tests.integration.test_runner import Job, TestEngine, start
from tests.integration.test_shrink_oom import plain
from trayapp.jobs.options import JobSpec
from trayapp.runner import protocol

pytestmark = pytest.mark.tensorflow

EXACT_FIT = Path(__file__).resolve().parent.parent / "scripts" / "runner" / "exact_fit.py"
SHRINKABLE = ["arrays-sgd", "arrays-momentum-schedule", "arrays-adam-validation-split",
              "arrays-adamw-whole-micro-batches", "arrays-rmsprop-sample-weight",
              "arrays-class-weight", "tensors-adam-schedule", "dataset-adam",
              "dataset-dropped-rmsprop-schedule", "dataset-validation-data-adamw",
              "dataset-unknown-length-momentum", "two-fits",
              "one-sample", "batch-over-the-dataset"]
ALL = SHRINKABLE + ["generator"]


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
    """Every case under plain python, at the full batch."""
    out = tmp_path_factory.mktemp("exact") / "plain.json"
    r = plain(EXACT_FIT, str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


def notes(engine: TestEngine) -> List[str]:
    return [m["message"] for m in engine.drain() if m["type"] == protocol.NOTE]


def worst(a: List[List[float]], b: List[List[float]]) -> float:
    return max(max(abs(p - q) for p, q in zip(wa, wb)) for wa, wb in zip(a, b))


def same_training(name: str, want: Dict[str, Any], got: Dict[str, Any],
                  history: bool = True) -> None:
    assert got["updates"] == want["updates"], (name, got["updates"], want["updates"])
    diff = worst(want["weights"], got["weights"])
    assert diff < 1e-5, f"{name}: the weights differ by {diff}"
    assert got["epochs"] == want["epochs"], name
    assert sorted(got["history"]) == sorted(want["history"]), name
    if history:
        for key, values in want["history"].items():
            assert got["history"][key] == pytest.approx(values, rel=1e-5, abs=1e-6), (name, key)


def run_job(tmp_path: Path, engine: TestEngine, jobs: List[Job], *args: str,
            **spec: Any) -> Dict[str, Any]:
    out = tmp_path / "report.json"
    job = start(jobs, JobSpec(fit_batch=False, script=str(EXACT_FIT), args=(str(out), *args),
                              python=sys.executable, **spec), tmp_path, engine)
    assert job.wait(timeout=300) == 0, job.output[-3000:]
    return json.loads(out.read_text())


def test_reference_batches_are_not_a_multiple_of_the_batch(reference: Dict[str, Any]) -> None:
    # 1003 samples at batch 64: 16 updates an epoch, the last of 43 samples; 1080 to train
    # (validation_split 0.1 of 1200): 17, the last of 56; drop_remainder: 15.
    assert reference["arrays-sgd"]["updates"] == 3 * 16
    assert reference["arrays-adam-validation-split"]["updates"] == 3 * 17
    assert reference["dataset-dropped-rmsprop-schedule"]["updates"] == 3 * 15
    assert reference["one-sample"]["updates"] == 3
    assert reference["two-fits"]["updates"] == 2 * 3 * 16
    assert reference["batch-over-the-dataset"]["updates"] == 3


def test_started_at_micro_batches_every_case_is_the_training_of_the_full_batch(
        tmp_path: Path, engine: TestEngine, jobs: List[Job], reference: Dict[str, Any]) -> None:
    got = run_job(tmp_path, engine, jobs, accumulation=4)
    for name in SHRINKABLE:
        assert got[name]["accumulation"] == 4, name
        same_training(name, reference[name], got[name])
    # A generator makes its own batches: trained at the full batch, and said so.
    assert got["generator"]["accumulation"] is None
    same_training("generator", reference["generator"], got["generator"])
    said = notes(engine)
    assert "started at micro-batches of 16 x 4 (batch 64, the same training)" in said, said
    assert any("a generator makes its own batches: it cannot shrink" in n and
               "trained at the full batch" in n for n in said), said


def test_shrunk_in_place_at_an_epoch_start_and_in_its_short_last_batch(
        tmp_path: Path, engine: TestEngine, jobs: List[Job], reference: Dict[str, Any]) -> None:
    # 64 -> 32 x 2 as epoch 2 begins; 32 x 2 -> 16 x 4 at the last micro-batch of epoch 3
    # (the short batch's second, half of its update done: trained again).
    got = run_job(tmp_path, engine, jobs, "--cases", ",".join(SHRINKABLE),
                  "--oom", "2:1", "--oom", "3:last")
    for name in SHRINKABLE:
        same_training(name, reference[name], got[name], history=False)
    said = notes(engine)
    assert any("out of memory at epoch 2, batch 1" in n and "micro-batches of 32 x 2" in n
               for n in said), said
    assert any("out of memory at epoch 3, batch 16" in n and "micro-batches of 16 x 4" in n
               for n in said), said


def test_an_epoch_shrunk_in_place_reports_its_metrics_over_the_whole_epoch(
        tmp_path: Path, engine: TestEngine, jobs: List[Job], reference: Dict[str, Any]) -> None:
    # 64 -> 32 x 2 at epoch 2's seventh batch; 32 x 2 -> 16 x 4 in the second micro-batch of
    # epoch 3's short last batch (half of its update trained again). The metrics' state
    # (means: total and count) of the batches done is kept: the History is plain python's.
    cases = [c for c in SHRINKABLE if c not in ("one-sample", "batch-over-the-dataset")]
    got = run_job(tmp_path, engine, jobs, "--cases", ",".join(cases),
                  "--oom", "2:7", "--oom", "3:last")
    for name in cases:
        same_training(name, reference[name], got[name])
    said = notes(engine)
    assert any("out of memory at epoch 2, batch 7" in n for n in said), said
    assert not any("metrics cover" in n for n in said), said


def test_a_micro_batch_floor_above_the_batch_fails_as_keras_would(
        tmp_path: Path, engine: TestEngine, jobs: List[Job]) -> None:
    out = tmp_path / "report.json"
    job = start(jobs, JobSpec(fit_batch=False, script=str(EXACT_FIT), python=sys.executable,
                              min_batch=128,
                              args=(str(out), "--cases", "arrays-sgd", "--oom", "1:3")),
                tmp_path, engine)
    assert job.wait() == 1
    assert "ResourceExhaustedError" in job.output
    assert not out.exists()
    said = notes(engine)
    assert any("out of memory in fit() at the smallest batch (micro-batch 64, --min-batch 128)"
               in n for n in said), said
