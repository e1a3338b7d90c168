"""One epoch numbering everywhere, the one Keras prints ("Epoch 15/30" is the 15th, from 1):
the progress column, the Options tab's last checkpoint, the checkpoint manager and the messages
about a checkpoint folder all say "epoch 15, batch 67" for the checkpoint saved at batch 67 of
"Epoch 15/30" (the runner records 14 epochs done and 67 batches of the 15th)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.ui.statuses import job
from trayapp import formats
from trayapp.jobs.checkpoint_folder import checkpoint_position
from trayapp.jobs.record import JobRecord
from trayapp.jobs.record_parts import Checkpoint
from trayapp.ui.job_rows import checkpoint_text, option_sections, progress_text


def test_a_checkpoint_mid_epoch_names_that_epoch_and_its_batch() -> None:
    assert formats.checkpoint_at(14, 67) == "epoch 15, batch 67"
    assert checkpoint_text(Checkpoint('/c/fit-1', 14, 67)) == \
        "/c/fit-1 (epoch 15, batch 67)"


def test_a_checkpoint_at_an_epoch_end_names_the_epoch_done() -> None:
    assert checkpoint_text(Checkpoint('/c/fit-1', 15, 0)) == \
        "/c/fit-1 (end of epoch 15)"
    assert checkpoint_text(Checkpoint('/c/fit-1', 15)) == "/c/fit-1 (end of epoch 15)"
    assert checkpoint_text(Checkpoint('/c/fit-1', 0, 0)) == \
        "/c/fit-1 (before epoch 1)"
    assert checkpoint_text(Checkpoint('/c/fit-1', None)) == "/c/fit-1"
    assert formats.checkpoint_at(True, 3) == ""


def test_the_options_tab_and_the_progress_column_say_the_same_epoch() -> None:
    # Saved at batch 67 of "Epoch 15/30", then shown while the job still stands there.
    rec = JobRecord.from_json(job(epoch=15, epochs=30, step=67, steps=100,
                                  checkpoint={"path": "/c/fit-1", "epoch": 14, "step": 67}))
    assert progress_text(rec).startswith("epoch 15/30 · step 67/100")
    rows = dict(option_sections(rec))["Checkpoint"]
    assert rows == [("last", "/c/fit-1 (epoch 15, batch 67)")]


def test_the_folder_message_says_the_same_epoch(tmp_path: Path) -> None:
    (tmp_path / "fit-1").mkdir()
    (tmp_path / "fit-1" / "training_metadata.json").write_text(json.dumps(
        {"epoch": 14, "batch": 66, "headroom": {"batches_done": 67, "fit": 1}}))
    assert checkpoint_position(str(tmp_path)) == (" (epoch 15, batch 67)", False)


def test_the_step_of_a_checkpoint_is_kept_through_the_checks() -> None:
    sent = {"id": "j1", "checkpoint": {"path": "/c/fit-1", "epoch": 21, "step": 2, "time": 1.0}}
    record = JobRecord.from_json(sent)
    assert record.checkpoint == Checkpoint("/c/fit-1", 21, 2, 1.0)
    assert record.to_json()["checkpoint"] == sent["checkpoint"]
