"""The jobs window with real Keras jobs on a real engine: the loss curve beside the memory chart,
the checkpoint manager (list, delete after asking, continue from one), Park disabled with its
reason on a job without a checkpoint folder, and a refusal that goes once the job has moved on."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List

import pytest
from PySide6.QtCore import Qt

from tests.conftest import REPO
from tests.ui.test_jobs_window import job_state, open_window, start_job
from trayapp.jobs.options import JobSpec, MemoryOptions
from trayapp.ui.jobs_window import CHECKPOINTS_TAB, TRAINING_TAB
from trayapp.vocab import ENDED
from trayapp.vocab import JobState as S

FIT_JOB = REPO / "tests" / "scripts" / "runner" / "fit_job.py"
TICKER = str(REPO / "tests" / "scripts" / "jobs" / "ticker.py")
pytestmark = [pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints"),
              pytest.mark.tensorflow]


def keras_job(engine, tmp_path: Path, ckpt: Path):  # type: ignore[no-untyped-def]
    spec = JobSpec(script=str(FIT_JOB), python=sys.executable, name="fit",
                   args=(str(tmp_path / "report"), "--epochs", "3", "--fits", "2",
                         "--steps", "8", "--sleep", "0.04"),
                   options=MemoryOptions(cpu_only=True), checkpoint_dir=str(ckpt),
                   cwd=str(tmp_path))
    with engine.client() as c:
        return c.job_start(spec.to_json())


def test_park_is_disabled_with_its_reason_and_a_refusal_goes(qtbot, paths,  # type: ignore
                                                             start_engine) -> None:
    engine = start_engine()
    ticker = start_job(engine, TICKER, "0", "0.05", name="ticker")
    window = open_window(qtbot, paths)
    assert window.select_job(ticker.id)
    qtbot.waitUntil(lambda: getattr(window.selected_job(), "state", None) == S.RUNNING,
                    timeout=20000)
    # The table shows more than a few jobs at the window's first size.
    rows = window.table.viewport().height() // window.table.verticalHeader().defaultSectionSize()
    assert rows >= 6, rows
    park = window.buttons["park"]
    assert not park.isEnabled()
    assert park.toolTip().startswith("Park needs a checkpoint folder, and this job has none")
    assert window.buttons["pause"].isEnabled()
    # A refusal, said beside the buttons: the table and the details do not move.
    where = window.detail_tabs.mapTo(window, window.detail_tabs.rect().topLeft())
    window.act("park")  # as a stale click would
    qtbot.waitUntil(lambda: "no checkpoint folder" in window.action_error.text(), timeout=15000)
    assert "\n" not in window.action_error.text()
    assert window.detail_tabs.mapTo(window, window.detail_tabs.rect().topLeft()) == where
    with engine.client() as c:
        c.job_action(ticker.id, "stop")
    qtbot.waitUntil(lambda: getattr(window.selected_job(), "state", None) in ENDED,
                    timeout=30000)
    qtbot.waitUntil(lambda: window.action_error.text() == "", timeout=5000)


def test_curves_and_the_checkpoint_manager(qtbot, paths, start_engine,  # type: ignore
                                           tmp_path) -> None:
    engine = start_engine()
    ckpt = tmp_path / "ckpt"
    job = keras_job(engine, tmp_path, ckpt)
    qtbot.waitUntil(lambda: job_state(engine, job.id) in ENDED, timeout=120000)
    assert job_state(engine, job.id) == S.FINISHED
    window = open_window(qtbot, paths)
    assert window.select_job(job.id)

    # The loss curve from the progress the runner sent, against the epoch.
    window.detail_tabs.setCurrentIndex(TRAINING_TAB)
    qtbot.waitUntil(lambda: "loss" in window.curves_chart.curves, timeout=20000)
    xs, ys = window.curves_chart.curves["loss"].getData()
    assert len(xs) >= 2 and 0.0 < min(xs) and max(xs) <= 6.0  # 2 fits of 3 epochs each
    assert [line.value() for line in window.curves_chart.fit_lines] == [3.0]  # fit 2 began
    assert window.curves_chart.note.text().startswith("Last: loss ")
    assert window.memory_chart.isVisibleTo(window)  # beside it

    # The checkpoints: one folder per fit(), where each stands, its size and time.
    window.detail_tabs.setCurrentIndex(CHECKPOINTS_TAB)
    pane = window.checkpoint_pane
    qtbot.waitUntil(lambda: pane.names() == ["fit-1", "fit-2"], timeout=20000)
    first = pane.tree.topLevelItem(0)
    assert first is not None and first.text(1) == "finished (end of epoch 3)"
    assert first.text(2).endswith("KiB") and first.text(3)
    assert pane.buttons["delete"].isEnabled() and pane.buttons["continue"].isEnabled()

    # Continue from fit-1: fit-2's checkpoint goes first, the job is launched with --resume.
    asked: List[str] = []
    window.confirm = lambda text: asked.append(text) or True
    pane.tree.setCurrentItem(first)
    with qtbot.waitSignal(window.relaunched, timeout=30000) as relaunched:
        qtbot.mouseClick(pane.buttons["continue"], Qt.MouseButton.LeftButton)
    assert "(fit-2) are deleted first" in asked[-1] and "--resume" in asked[-1]
    new = relaunched.args[0]
    assert new.id != job.id and new.spec["resume"] is True
    assert not (ckpt / "fit-2").exists() and (ckpt / "fit-1" / "latest.weights.h5").exists()
    qtbot.waitUntil(lambda: job_state(engine, new.id) in ENDED, timeout=120000)
    assert job_state(engine, new.id) == S.FINISHED
    qtbot.waitUntil(lambda: window.selected_id == new.id, timeout=10000)
    qtbot.waitUntil(lambda: getattr(window.selected_job(), "state", None) in ENDED,
                    timeout=10000)
    assert pane.buttons["delete"].isEnabled()  # no longer live: its checkpoints may go

    # Delete fit-2 (trained again by the relaunch): asked first; "no" keeps it.
    qtbot.waitUntil(lambda: pane.names() == ["fit-1", "fit-2"], timeout=20000)
    pane.tree.setCurrentItem(pane.tree.topLevelItem(1))
    window.confirm = lambda text: asked.append(text) and False
    qtbot.mouseClick(pane.buttons["delete"], Qt.MouseButton.LeftButton)
    assert asked[-1].startswith("Delete checkpoint fit-2 of fit")
    assert (ckpt / "fit-2").exists()
    window.confirm = lambda text: True
    pane.tree.setCurrentItem(pane.tree.topLevelItem(1))
    qtbot.mouseClick(pane.buttons["delete"], Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: pane.names() == ["fit-1"], timeout=20000)
    assert not (ckpt / "fit-2").exists()


def test_a_parked_state_says_who_once() -> None:
    from trayapp.jobs.record import JobRecord
    from trayapp.ui.job_rows import state_text
    parked = JobRecord.from_json({"id": "a", "state": S.PARKED, "end_reason": "parked by user"})
    assert state_text(parked) == "parked by user"  # a record from before parked_by
    parked = JobRecord.from_json({"id": "a", "state": S.PARKED, "parked_by": "user",
                                  "end_reason": "parked by user"})
    assert state_text(parked) == "parked by you"
    parked = JobRecord.from_json({"id": "a", "state": S.PARKED, "parked_by": "guard",
                                  "park_reason": "memory low"})
    assert state_text(parked) == "parked by the guard: memory low"
    failed = JobRecord.from_json({"id": "b", "state": S.FAILED, "end_reason": "exit status 3"})
    assert state_text(failed) == "failed (exit status 3)"


def test_a_long_reason_is_whole_in_its_tooltip(qtbot) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtCore import Qt as QtNs

    from trayapp.jobs.record import JobRecord
    from trayapp.ui.jobs_table import JobsModel
    reason = ("RAM below 8% for 30 s while this job grew 1.2 GiB in a minute; it resumes when "
              "20% is free again")
    model = JobsModel()
    model.update_jobs([JobRecord.from_json({"id": "a", "state": S.PAUSED, "paused_by": "guard",
                                            "pause_reason": reason})], complete=True)
    tip = model.data(model.index(0, 1), QtNs.ItemDataRole.ToolTipRole)
    assert tip == f"paused by the guard: {reason}"
