"""Where training stopped, as the job's log and its progress say it, with real Keras jobs
through the real runner: a park inside an epoch leaves Keras's bar at the batches done (not
closed at the epoch's last) and the log says "parked at batch 306 of 313"; a fit trained in
micro-batches draws a bar that counts the user's batches, not its micro-steps; the progress
moves to the next epoch as it begins."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import List

import pytest

from tests.conftest import wait_for
from tests.integration.test_runner import Job, TestEngine, engine, jobs, of, start  # noqa: F401
from trayapp.jobs.options import JobSpec, MemoryOptions
from trayapp.runner import protocol

pytestmark = pytest.mark.tensorflow

BAR_FIT = Path(__file__).resolve().parent.parent / "scripts" / "runner" / "bar_fit.py"
STEPS = 313  # 10 000 samples at batch 32
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def bar_counts(output: str) -> List[str]:
    """Every "done/of" Keras's bar drew, in order."""
    text = ANSI.sub("", output).replace("\r", "\n")
    return re.findall(r"^\s*(\d+/\d+) ", text, flags=re.M)


def spec(out: Path, tmp_path: Path, *args: str, **fields) -> JobSpec:
    return JobSpec(script=str(BAR_FIT), args=(str(out), *args), python=sys.executable,
                   options=MemoryOptions(cpu_only=True), **fields)


def held(job: Job, out: Path) -> None:
    """Wait until the job holds at its gate (or ended, which fails)."""
    wait_for(lambda: Path(str(out) + ".held").exists() or job.process.poll() is not None,
             timeout=180, what="the job to hold at its gate")
    assert job.process.poll() is None, job.output


def test_a_park_inside_an_epoch_leaves_the_bar_where_training_stopped(
        tmp_path: Path, engine: TestEngine, jobs: List[Job]) -> None:  # noqa: F811
    out, gate = tmp_path / "run", tmp_path / "gate"
    job = start(jobs, spec(out, tmp_path, "--hold-epoch", "1", "--hold-batch", "305",
                           "--gate", str(gate), checkpoint_dir=str(tmp_path / "ckpt")),
                tmp_path, engine)
    held(job, out)
    engine.send(protocol.PARK)
    engine.wait_for(of("state", state="parking"), timeout=60)
    gate.touch()
    saved = engine.wait_for(of("checkpointed", reason="park"), timeout=60)
    assert job.wait() == protocol.PARK_EXIT_CODE, job.output
    assert (saved["epoch"], saved["step"]) == (1, 306)  # the park lands at the next batch
    output = job.output
    assert "headroom: parked at batch 306 of 313 (epoch 2 of 2)" in output, output[-3000:]
    counts = bar_counts(output)
    # Epoch 1 closed at its last batch (drawn once or twice, as Keras's bar times its lines);
    # epoch 2's bar stays where training stopped and never reaches the epoch's end.
    assert "313/313" in counts and counts[-1] == "306/313", counts[-5:]
    closed = max(i for i, c in enumerate(counts) if c == "313/313")
    epoch2 = counts[closed + 1:]
    assert epoch2 and all(int(c.split("/")[0]) <= 306 for c in epoch2), (counts, epoch2)
    assert "Traceback" not in output
    # The progress the engine last had says the same: epoch 2, 306 of 313 batches.
    last = [m for m in engine.drain() if m["type"] == protocol.PROGRESS][-1]
    assert (last["epoch"], last["step"], last["steps"]) == (2, 306, STEPS), last


def test_a_stop_inside_an_epoch_says_so_in_the_log(
        tmp_path: Path, engine: TestEngine, jobs: List[Job]) -> None:  # noqa: F811
    out, gate = tmp_path / "run", tmp_path / "gate"
    job = start(jobs, spec(out, tmp_path, "--epochs", "1", "--hold-batch", "9",
                           "--gate", str(gate)), tmp_path, engine)
    held(job, out)
    engine.send(protocol.STOP)
    engine.wait_for(of("state", state="stopping"), timeout=60)
    gate.touch()
    assert job.wait() == protocol.STOP_EXIT_CODE, job.output
    output = job.output
    assert "headroom: stopped at batch 10 of 313 (epoch 1 of 1)" in output, output[-3000:]
    assert bar_counts(output)[-1] == "10/313" and "313/313" not in bar_counts(output)


def test_a_fit_in_micro_batches_draws_the_users_batches(
        tmp_path: Path, engine: TestEngine, jobs: List[Job]) -> None:  # noqa: F811
    out = tmp_path / "run"
    job = start(jobs, spec(out, tmp_path, "--epochs", "1", fit_batch=True), tmp_path, engine)
    engine.wait_for(of(protocol.FORECAST, how="probe"), timeout=120)
    engine.conn.send_bytes(protocol.encode(protocol.make(protocol.FIT, accumulation=4)))
    assert job.wait() == 0, job.output
    assert json.loads(Path(str(out) + ".json").read_text())["updates"] == STEPS
    counts = bar_counts(job.output)
    # 313 batches of 32 in micro-batches of 8: 1250 micro-steps, drawn as the 313 batches.
    assert counts and counts[-1] == "313/313", counts[-5:]
    assert all(c.endswith("/313") for c in counts), counts
    done = [int(c.split("/")[0]) for c in counts]
    assert done == sorted(done)
    progress = [m for m in engine.drain() if m["type"] == protocol.PROGRESS and m.get("steps")]
    assert progress and all(m["steps"] == STEPS and m["step"] <= STEPS for m in progress)


def test_the_progress_moves_to_the_next_epoch_as_it_begins(
        tmp_path: Path, engine: TestEngine, jobs: List[Job]) -> None:  # noqa: F811
    out, gate = tmp_path / "run", tmp_path / "gate"
    job = start(jobs, spec(out, tmp_path, "--hold-epoch", "1", "--hold-batch", "0",
                           "--gate", str(gate)), tmp_path, engine)
    held(job, out)
    # Held at epoch 2's first batch: the progress says epoch 2, not epoch 1 at 313 of 313.
    begun = engine.wait_for(of(protocol.PROGRESS, epoch=2, step=0), timeout=60)
    assert begun["steps"] == STEPS
    gate.touch()
    assert job.wait() == 0, job.output
