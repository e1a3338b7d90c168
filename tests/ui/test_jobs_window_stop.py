"""The jobs window says what stop does, resumes a stopped job that has a checkpoint folder, and
asks before a relaunch would write over an earlier run's checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

import pytest
from PySide6.QtCore import Qt

from trayapp.engine.client import EngineClient
from trayapp.jobs.record import JobRecord
from trayapp.ui.job_rows import RELAUNCH_CHOICES, actions_for, relaunch_spec, stop_question
from trayapp.ui.jobs_window import JobsWindow
from trayapp.ui.launch import LaunchDialog
from trayapp.vocab import JobState as S

REPO = Path(__file__).resolve().parents[2]
EXIT_WITH = str(REPO / "tests" / "scripts" / "jobs" / "exit_with.py")
pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")


def test_the_stop_question_says_what_happens_to_the_checkpoint_and_the_script() -> None:
    keras = JobRecord(id="ab12", name="mnist", hooked=True, checkpoint_dir="/ck")
    text = stop_question(keras)
    assert "saves a checkpoint" in text and "after fit()) does not run" in text
    assert "Resume continues it" in text
    bare = stop_question(keras.with_(checkpoint_dir=None))
    assert "no checkpoint folder" in bare and "progress is lost" in bare
    assert "after fit()) does not run" in bare
    plain = stop_question(JobRecord(id="cd34", name="loop", hooked=False))
    assert "interrupted" in plain and "rest of its script does not run" in plain


def test_a_stopped_job_with_a_checkpoint_folder_can_be_resumed() -> None:
    assert actions_for(JobRecord(id="a", state=S.STOPPED, resumable=True)) == ("resume",)
    assert actions_for(JobRecord(id="a", state=S.STOPPED, resumable=False)) == ()
    assert actions_for(JobRecord(id="a", state=S.FINISHED)) == ()
    # The engine's word for it reaches the record.
    assert JobRecord.from_json({"id": "a", "state": S.STOPPED, "resumable": True}).resumable


def test_the_relaunch_choice_becomes_resume_or_fresh() -> None:
    spec = {"script": "/w/train.py", "checkpoint_dir": "/ck", "resume": True}
    assert relaunch_spec(spec, 0) == {**spec, "resume": True, "fresh": False}
    assert relaunch_spec(spec, 1) == {**spec, "resume": False, "fresh": True}
    assert relaunch_spec(spec, None) == {**spec, "resume": False, "fresh": False}
    assert relaunch_spec(spec, 5) is None


def state(engine, job_id: str) -> str:  # type: ignore[no-untyped-def]
    with engine.client() as c:
        return str(c.job_get(job_id).state)


def open_window(qtbot, paths) -> JobsWindow:  # type: ignore[no-untyped-def]
    window = JobsWindow(lambda: EngineClient(paths, timeout=10.0), poll_ms=200)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.loaded, timeout=15000)
    return window


def test_relaunch_asks_before_it_writes_over_a_checkpoint(qtbot, paths, start_engine,  # type: ignore
                                                          tmp_path) -> None:
    engine = start_engine()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with engine.client() as c:
        job = c.job_start({"script": EXIT_WITH, "args": ["0"], "name": "quick",
                           "checkpoint_dir": str(ckpt), "options": {"cpu_only": True}})
    qtbot.waitUntil(lambda: state(engine, job.id) == S.FINISHED,
                    timeout=30000)
    # What the earlier run left: a checkpoint the runner wrote.
    (ckpt / "fit-1").mkdir()
    (ckpt / "fit-1" / "training_metadata.json").write_text('{"epoch": 3}')

    window = open_window(qtbot, paths)
    qtbot.waitUntil(lambda: window.select_job(job.id), timeout=10000)
    qtbot.waitUntil(lambda: window.selected_id == job.id, timeout=10000)
    asked: List[Tuple[str, Tuple[str, ...]]] = []
    answer: List[Optional[int]] = [None]

    def choose(text: str, choices: Tuple[str, ...]) -> Optional[int]:
        asked.append((text, choices))
        return answer[0]

    window.choose = choose
    # Cancelled: nothing starts.
    qtbot.mouseClick(window.buttons["relaunch"], Qt.MouseButton.LeftButton)
    assert asked and str(ckpt) in asked[0][0] and asked[0][1] == RELAUNCH_CHOICES
    qtbot.wait(300)
    with engine.client() as c:
        assert [j.id for j in c.jobs(all=True)] == [job.id]

    # Start over: the new job's spec says so.
    answer[0] = 1
    with qtbot.waitSignal(window.relaunched, timeout=20000) as relaunched:
        qtbot.mouseClick(window.buttons["relaunch"], Qt.MouseButton.LeftButton)
    fresh = relaunched.args[0]
    assert fresh.id != job.id
    assert (fresh.spec["fresh"], fresh.spec["resume"]) == (True, False)

    # Continue: from the checkpoint.
    qtbot.waitUntil(lambda: state(engine, fresh.id) == S.FINISHED,
                    timeout=30000)
    (ckpt / "fit-1").mkdir(exist_ok=True)
    (ckpt / "fit-1" / "training_metadata.json").write_text('{"epoch": 3}')
    qtbot.waitUntil(lambda: window.select_job(job.id), timeout=10000)
    qtbot.waitUntil(lambda: window.selected_id == job.id, timeout=10000)
    answer[0] = 0
    with qtbot.waitSignal(window.relaunched, timeout=20000) as relaunched:
        qtbot.mouseClick(window.buttons["relaunch"], Qt.MouseButton.LeftButton)
    resumed = relaunched.args[0]
    assert (resumed.spec["fresh"], resumed.spec["resume"]) == (False, True)
    assert len(asked) == 3


def test_the_launch_dialog_needs_resume_or_start_over_on_a_checkpoint(  # type: ignore
        qtbot, paths, start_engine, tmp_path) -> None:

    start_engine(demo=True)
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")
    ckpt = tmp_path / "ckpt"
    (ckpt / "fit-1").mkdir(parents=True)
    (ckpt / "fit-1" / "training_metadata.json").write_text('{"epoch": 3}')
    dialog = LaunchDialog(lambda: EngineClient(paths, timeout=10.0), state_dir=paths.data_dir,
                          probe_cache=tmp_path / "probes")
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitUntil(lambda: dialog.status_loaded, timeout=15000)
    dialog.choose_script(str(script))
    dialog.ckpt_edit.setText(str(ckpt))
    dialog.revalidate()
    error = dialog.row_errors["checkpoint"].text()
    assert str(ckpt) in error and "--resume" in error and "--fresh" in error
    assert not dialog.launch_button.isEnabled()
    dialog.fresh_box.setChecked(True)
    spec = dialog.revalidate()
    assert spec is not None and spec.fresh and not spec.resume
    assert "starts over and deletes the one there" in dialog.summary_label.text()
    dialog.resume_box.setChecked(True)  # both: one line on the resume row
    dialog.revalidate()
    assert "cannot be combined" in dialog.row_errors["resume"].text()
    dialog.fresh_box.setChecked(False)
    assert dialog.revalidate() is not None
