"""How a job reads in the terminal (``run``'s progress line, the ``jobs`` table, an action's
answer) and the exit status of ``headroom run``, from job records read as the engine sends
them."""

from __future__ import annotations

import time
from typing import Any, Dict, Optional

import pytest

from trayapp.cli.follow import exit_status
from trayapp.cli.jobs import (
    describe,
    describe_kernel_stop,
    format_jobs,
    progress_cell,
    progress_text,
    state_text,
)
from trayapp.cli.status import format_job_line
from trayapp.jobs.record import JobRecord
from trayapp.runner.protocol import PARK_EXIT_CODE, STOP_EXIT_CODE

GiB = 2**30


def job(**fields: Any) -> JobRecord:
    return JobRecord.from_json({"id": "ab12", "name": "mnist", "state": "running", **fields})


@pytest.mark.parametrize("fields, text", [
    ({}, "[ab12] running · RAM n/a · VRAM n/a"),
    ({"epoch": 3, "epochs": 10, "step": 50, "steps": 100, "metrics": {"loss": 0.123456},
      "eta_seconds": 3725, "rss_bytes": 6 * GiB, "vram_bytes": GiB},
     "[ab12] running · epoch 3/10 · step 50/100 · loss 0.1235 · ETA 1h02m · RAM 6.0 GiB · "
     "VRAM 1.0 GiB"),
    ({"state": "paused", "pause_mode": "runner", "epochs": 5},
     "[ab12] paused (runner) · epoch 0/5 · RAM n/a · VRAM n/a"),
    ({"metrics": {"loss": "nan?"}, "eta_seconds": 42}, "[ab12] running · ETA 42s · RAM n/a · "
                                                      "VRAM n/a"),
])
def test_the_progress_line(fields: Dict[str, Any], text: str) -> None:
    assert progress_text(job(**fields)) == text


@pytest.mark.parametrize("fields, cell", [
    ({}, "-"),
    ({"epoch": 2, "epochs": 4}, "epoch 2/4"),
    ({"state": "failed", "exit_code": 7, "steps": 9, "step": 9}, "step 9/9, exit 7"),
    ({"state": "running", "exit_code": 7}, "-"),  # a live job has no exit status yet
    ({"epoch": 2, "epochs": 3, "batch": 8, "micro_batch": 8, "accumulation": 1}, "epoch 2/3"),
])
def test_the_progress_cell(fields: Dict[str, Any], cell: str) -> None:
    assert progress_cell(job(**fields)) == cell


KERNEL = {"kind": "kernel", "hooked": True, "epoch": 29, "epochs": 400, "step": 256,
          "steps": 256, "eta_seconds": 600, "metrics": {"loss": 0.5}}


def test_a_kernel_between_fits_shows_its_last_fit_as_such() -> None:
    idle = job(**KERNEL, runner_state="idle")
    assert progress_cell(idle) == "idle (last fit: epoch 29/400, step 256/256)"
    line = progress_text(idle)
    assert "idle, last fit epoch 29/400 · step 256/256 · loss 0.5" in line
    assert "ETA" not in line  # the last fit's estimate is no time left of anything now
    assert progress_cell(job(kind="kernel")) == "idle"  # no fit() yet
    # In a fit, and a script, read as before.
    assert progress_cell(job(**KERNEL, runner_state="running")) == "epoch 29/400, step 256/256"
    assert "ETA" in progress_text(job(**KERNEL, runner_state="running"))
    assert progress_cell(job(**dict(KERNEL, kind="script"))) == "epoch 29/400, step 256/256"
    # An ended kernel's last fit is simply where it got to.
    assert progress_cell(job(**KERNEL, state="stopped")) == "epoch 29/400, step 256/256"


def test_a_kernels_stop_says_the_kernel_and_its_variables_are_gone() -> None:
    ended = describe_kernel_stop(job(kind="kernel", name="train.ipynb", state="stopped",
                                     stopped_by="user"))
    assert ended.startswith("kernel ab12 (train.ipynb): stopped by you; ")
    assert "shut down" in ended and "variables are lost" in ended
    stopping = describe_kernel_stop(job(kind="kernel", state="stopping", stopped_by="user"))
    assert "next batch end" in stopping and "variables are lost" in stopping


@pytest.mark.parametrize("fields, line", [
    ({}, "job ab12 (mnist): running"),
    ({"state": "paused", "pause_mode": "signal"}, "job ab12 (mnist): paused (signal)"),
    ({"state": "failed", "end_reason": "exit status 1"},
     "job ab12 (mnist): failed (exit status 1)"),
    ({"state": "parked", "end_reason": "parked by guard"}, "job ab12 (mnist): parked by guard"),
    ({"state": "parked", "parked_by": "guard", "park_reason": "memory low",
      "end_reason": "parked by guard: memory low"},
     "job ab12 (mnist): parked by the guard: memory low"),
    ({"state": "parked", "parked_by": "user", "park_reason": "Ctrl-C in headroom run"},
     "job ab12 (mnist): parked by you: Ctrl-C in headroom run"),
    ({"state": "paused", "pause_mode": "cooperative", "paused_by": "guard",
      "pause_reason": "available RAM 7% < 8%"},
     "job ab12 (mnist): paused at a batch end by the guard: available RAM 7% < 8%"),
    ({"state": "stopped", "stopped_by": "engine", "end_reason": "stopped by engine"},
     "job ab12 (mnist): stopped by the engine"),
    ({"state": "finished", "end_reason": "finished"}, "job ab12 (mnist): finished"),
])
def test_an_actions_answer(fields: Dict[str, Any], line: str) -> None:
    assert describe(job(**fields)) == line


@pytest.mark.parametrize("fields, state", [
    ({"state": "paused", "pause_mode": "cooperative"}, "paused at a batch end"),
    ({"state": "paused", "pause_mode": "cooperative", "paused_by": "user"},
     "paused at a batch end by you"),
    ({"state": "paused", "pause_mode": "suspended", "paused_by": "guard"},
     "paused (its processes suspended) by the guard"),
    ({"state": "parked", "parked_by": "user", "park_reason": "x"}, "parked by you"),
    ({"state": "parked", "parked_by": "guard"}, "parked by the guard"),
    ({"state": "parking", "parked_by": "guard"}, "parking by the guard"),
    ({"state": "stopped", "stopped_by": "user"}, "stopped by you"),
    ({"state": "running", "paused_by": "user"}, "running"),  # an old pause is not told
])
def test_the_state_words(fields: Dict[str, Any], state: str) -> None:
    assert state_text(job(**fields)) == state
    assert "(cooperative)" not in describe(job(**fields))


def test_a_parked_or_stopped_job_says_so_not_its_exit_status() -> None:
    text = format_jobs([job(state="parked", parked_by="user", exit_code=PARK_EXIT_CODE),
                        job(id="cd34", state="stopped", stopped_by="user",
                            exit_code=STOP_EXIT_CODE),
                        job(id="ef56", state="failed", exit_code=3)])
    _, parked, stopped, failed = text.splitlines()
    assert "parked by you" in parked and "exit" not in parked
    assert "stopped by you" in stopped and "exit" not in stopped
    assert "exit 3" in failed
    assert "exit" not in format_job_line(job(state="parked", exit_code=PARK_EXIT_CODE))


def test_the_table() -> None:
    assert format_jobs([]) == "no jobs"
    now = time.time()
    text = format_jobs([job(started=now, rss_bytes=GiB, name="x" * 30),
                        job(id="cd34", state="stopped", exit_code=-15)])
    head, first, second = text.splitlines()
    assert head.split() == ["ID", "NAME", "STATE", "PROGRESS", "RAM", "VRAM", "STARTED",
                            "PROTECTION"]
    assert first.split()[:5] == ["ab12", "x" * 24, "running", "-", "1.0"]
    assert first.endswith(time.strftime("%H:%M:%S", time.localtime(now)))
    braked = format_jobs([job(protection="kernel brake (cgroup v1)"),
                          job(id="cd34", protection="none: the guard only (its cgroup is gone)")])
    assert [line.split()[-1] for line in braked.splitlines()[1:]] == ["brake-v1", "guard"]
    assert second.split() == ["cd34", "mnist", "stopped", "exit", "-15", "n/a", "n/a", "n/a"]


@pytest.mark.parametrize("state, code, interrupted, status", [
    ("finished", 0, False, 0),
    ("parked", None, False, PARK_EXIT_CODE),
    ("stopped", None, False, STOP_EXIT_CODE),
    ("stopped", None, True, 130),
    ("failed", 7, False, 7),
    ("failed", -9, False, 128 + 9),
    ("failed", 300, False, 1),
    ("failed", None, False, 1),
    ("lost", None, False, 1),
])
def test_the_exit_status_of_run(state: str, code: Optional[int], interrupted: bool,
                                status: int) -> None:
    assert exit_status(job(state=state, exit_code=code), interrupted) == status


def test_the_old_name_of_who_parked_a_job_is_read() -> None:
    assert job(state="parked", park_by="guard").parked_by == "guard"


def test_a_job_that_does_not_answer_says_so_while_it_lives() -> None:
    cut = job(state="paused", pause_mode="suspended", paused_by="user", answering=False)
    assert state_text(cut) == "paused (its processes suspended) by you, not answering"
    assert "not answering" in format_jobs([cut])
    assert "not answering" not in state_text(job(answering=True))
    assert "not answering" not in state_text(job(state="failed", answering=False))
