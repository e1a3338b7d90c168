"""The guard's "relaunch smaller": a Keras job over its RAM budget that can shrink is paused,
parked and relaunched at once from its checkpoint at half its micro-batch (twice the
accumulation), and its whole training is done. A real engine, a real job on tensorflow-cpu.
The guard alone (``guard.kernel_brake = false``): with the brake, test_kernel_brake.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, List

import pytest

from tests.conftest import EngineProcess
from tests.integration.test_guard_e2e import wait_for, wait_state
from trayapp.config import Paths
from trayapp.engine.event_record import EngineEvent
from trayapp.jobs.options import JobSpec
from trayapp.vocab import EventKind as E
from trayapp.vocab import JobState as S

pytestmark = pytest.mark.tensorflow

WIDE_FIT = Path(__file__).resolve().parent.parent / "scripts" / "runner" / "wide_fit.py"
MiB = 1024 * 1024
# Measured peaks of WIDE_FIT: about 1.6 GB at batch 4096, 1.1 GB at 2048.
BUDGET_MB = 1350
EPOCHS = 2
ENDED = {S.FINISHED, S.FAILED, S.STOPPED, S.LOST, S.PARKED}


def guard_alone(paths: Paths) -> None:
    """The guard without the kernel brake: the budget is held against the tree's RSS. Its
    samples come every 50 ms: a step of WIDE_FIT at batch 4096 is over the budget for a tenth
    of a second or so (its peak), which samples a quarter of a second apart or more can miss
    (the kernel brake does not: the cgroup's limit holds every page)."""
    (paths.home / "config.toml").write_text(
        "[guard]\nkernel_brake = false\n[engine]\nsample_interval = 0.05\n"
    )


def events(client: Any, job_id: str) -> List[EngineEvent]:
    return [e for e in client.events(limit=500) if e.job_id == job_id]


def test_a_job_over_its_budget_is_relaunched_smaller_and_finishes(
        start_engine: Callable[..., EngineProcess], tmp_path: Path, paths: Paths) -> None:
    guard_alone(paths)
    engine = start_engine()
    out, ckpt = tmp_path / "report.json", tmp_path / "ckpt"
    spec = JobSpec(fit_batch=False, script=str(WIDE_FIT), args=(str(out), "4096", str(EPOCHS)),
                   python=sys.executable, ram_budget_mb=BUDGET_MB, checkpoint_dir=str(ckpt))
    client = engine.client()
    job_id = client.job_start(spec.to_json()).id
    # The training asked for: the same fit at batch 4096 without Headroom, meanwhile.
    ref = tmp_path / "reference.json"
    plain = subprocess.Popen([sys.executable, str(WIDE_FIT), str(ref), "4096", str(EPOCHS)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        job = wait_state(client, job_id, ENDED, 240)
        said = events(client, job_id)
        assert job.state == S.FINISHED, (job, [e.message for e in said])
        assert (job.batch, job.micro_batch, job.accumulation) == (4096, 2048, 2)
        kinds = [e.kind for e in said]
        assert E.GUARD_PAUSE in kinds and E.GUARD_PARK in kinds
        assert kinds.index(E.GUARD_PAUSE) < kinds.index(E.GUARD_PARK)
        park = next(e for e in said if e.kind == E.GUARD_PARK)
        assert park.data["cause"] == "budget_ram" and park.data["smaller"] == 2
        assert "micro-batches of 2048 x 2 (the same training)" in park.message
        relaunch = [e for e in said if e.kind == E.JOB_RESUMED and e.data.get("relaunched")]
        assert relaunch and relaunch[0].data["accumulation"] == 2, said
        assert kinds.index(E.JOB_PARKED) < kinds.index(E.JOB_RESUMED)
        report = json.loads(out.read_text())
        assert report["updates"] == EPOCHS * 2  # two updates an epoch: the whole training
        assert report["accumulation"] == 2
        _, err = plain.communicate(timeout=240)
        assert plain.returncode == 0, err[-2000:]
        expected = json.loads(ref.read_text())["weights"]
        assert report["weights"] == pytest.approx(expected, rel=1e-4)
    finally:
        if plain.poll() is None:
            plain.kill()
            plain.wait()
        if plain.stderr is not None:  # a test that failed early never read it
            plain.stderr.close()
        try:
            client.job_action(job_id, "kill")
        except Exception:
            pass
        client.close()


def test_a_job_that_cannot_shrink_stays_paused_at_its_budget(
        start_engine: Callable[..., EngineProcess], tmp_path: Path, paths: Paths) -> None:
    """--on-oom stop: the runner says the fit cannot shrink; the guard pauses, as before."""
    guard_alone(paths)
    engine = start_engine()
    out, ckpt = tmp_path / "report.json", tmp_path / "ckpt"
    spec = JobSpec(fit_batch=False, script=str(WIDE_FIT), args=(str(out), "4096", str(EPOCHS)),
                   python=sys.executable, ram_budget_mb=BUDGET_MB, checkpoint_dir=str(ckpt),
                   on_oom="stop")
    client = engine.client()
    job_id = client.job_start(spec.to_json()).id
    try:
        job = wait_state(client, job_id, {S.PAUSED} | ENDED, 240)
        assert job.state == S.PAUSED and job.paused_by == "guard" and not job.shrinkable
        wait_for("a few guard ticks", lambda: len(events(client, job_id)) >= 2, 10)
        assert E.GUARD_PARK not in [e.kind for e in events(client, job_id)]
    finally:
        try:
            client.job_action(job_id, "kill")
        except Exception:
            pass
        client.close()
