"""The jobs window names a job's last checkpoint in the progress column's terms: the runner counts
the epochs done from 0, the window shows "Epoch 22/30" for the 22nd."""

from __future__ import annotations

from trayapp.jobs import messages
from trayapp.ui.job_rows import checkpoint_text


def test_a_checkpoint_mid_epoch_names_that_epoch_and_its_steps() -> None:
    # Stopped at step 3 of "Epoch 22/30": 21 epochs done, and 2 steps of the 22nd.
    assert checkpoint_text({"path": "/c/fit-1", "epoch": 21, "step": 2}) == \
        "/c/fit-1 (in epoch 22, after step 2)"


def test_a_checkpoint_at_an_epoch_end_names_the_epoch_done() -> None:
    assert checkpoint_text({"path": "/c/fit-1", "epoch": 26, "step": 0}) == \
        "/c/fit-1 (after epoch 26)"
    assert checkpoint_text({"path": "/c/fit-1", "epoch": 26}) == "/c/fit-1 (after epoch 26)"
    assert checkpoint_text({"path": "/c/fit-1", "epoch": 0, "step": 0}) == \
        "/c/fit-1 (before the first epoch)"
    assert checkpoint_text({"path": "/c/fit-1", "epoch": None}) == "/c/fit-1"


def test_the_step_of_a_checkpoint_is_kept_through_the_checks() -> None:
    record = messages._checkpoint_record({"path": "/c/fit-1", "epoch": 21, "step": 2,
                                          "time": 1.0})
    assert record is not None and record["step"] == 2
