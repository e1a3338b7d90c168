"""End to end: a small real Keras script launched from the launch dialog (CPU only) on a real
engine, followed in the jobs window, paused and resumed from it, finished with its exit status."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from trayapp.engine.client import EngineClient
from trayapp.jobs.record import JobRecord
from trayapp.ui.job_rows import progress_fraction
from trayapp.ui.jobs_window import JobsWindow
from trayapp.ui.launch import LaunchDialog
from trayapp.vocab import JobState as S

KERAS_TRAIN = Path(__file__).resolve().parents[1] / "scripts" / "jobs" / "keras_train.py"

pytestmark = [
    pytest.mark.tensorflow,
    pytest.mark.slow,
    pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints"),
]


def test_keras_job_from_dialog_to_finish(qtbot, paths, start_engine,  # type: ignore
                                         tmp_path) -> None:
    engine = start_engine()
    factory = lambda: EngineClient(paths, timeout=10.0)  # noqa: E731

    dialog = LaunchDialog(factory, state_dir=paths.data_dir, probe_cache=tmp_path / "probes")
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitUntil(lambda: dialog.status_loaded, timeout=15000)
    dialog.choose_script(str(KERAS_TRAIN))
    dialog.args_edit.setText("3 20 0.05")  # 3 epochs of 20 batches, 50 ms each
    dialog.apply_preset("cpu-only")
    dialog.revalidate()
    assert dialog.launch_button.isEnabled(), dialog.error
    assert dialog.summary_label.text().startswith("TensorFlow runs on the CPU only")
    with qtbot.waitSignal(dialog.launched, timeout=30000) as launched:
        qtbot.mouseClick(dialog.launch_button, Qt.MouseButton.LeftButton)
    job_id = launched.args[0].id

    window = JobsWindow(factory, poll_ms=250)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.model.job(job_id) is not None, timeout=15000)
    assert window.select_job(job_id)

    def job() -> JobRecord:
        return window.selected_job() or JobRecord(id=job_id)

    # Progress from the runner inside Keras's fit(), shown as epoch and step.
    qtbot.waitUntil(lambda: (job().step or 0) >= 3, timeout=90000)
    assert job().epochs == 3 and job().steps == 20
    assert 0 < (progress_fraction(job()) or 0) < 1
    row = window.proxy.mapFromSource(window.model.index(window.model.row_of(job_id), 2)).row()
    assert window.proxy.index(row, 2).data().startswith("epoch ")

    # Pause from the window: the runner stops at a batch end and progress stands still.
    qtbot.mouseClick(window.buttons["pause"], Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: job().state == S.PAUSED, timeout=30000)
    assert job().pause_mode == "cooperative"
    held = (job().epoch, job().step)
    qtbot.wait(1500)
    assert (job().epoch, job().step) == held
    assert job().state == S.PAUSED

    # Resume from the window: training goes on to the end.
    qtbot.waitUntil(lambda: window.buttons["resume"].isEnabled(), timeout=5000)
    qtbot.mouseClick(window.buttons["resume"], Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: (job().epoch, job().step) != held, timeout=30000)
    qtbot.waitUntil(lambda: job().state == S.FINISHED, timeout=90000)
    assert job().exit_code == 0
    assert "exit status 0" in window.header_label.text()
    assert progress_fraction(job()) == 1.0
    qtbot.waitUntil(lambda: "training done" in window.log_text(), timeout=15000)
    qtbot.waitUntil(lambda: any(e.endswith("finished") for e in window.event_lines()),
                    timeout=15000)
    lines = window.event_lines()
    assert any("paused at a batch end by you" in e for e in lines)
    assert any(e.endswith("resumed by you") for e in lines)
    with engine.client() as c:
        assert c.job_get(job_id).exit_code == 0
    # The dialog remembered the settings for this script.
    assert dialog.recent_store.spec_for(str(KERAS_TRAIN))["args"] == ["3", "20", "0.05"]
