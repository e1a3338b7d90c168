"""The launch dialog holds still: no field moves when the interpreter probe ends (its progress,
what the interpreter has and what the doctor says have room kept for them) or when a problem is
said (it takes the place of the row's one-line explanation, cut to it, the whole text in its
tooltip)."""

from __future__ import annotations

from typing import Dict, Tuple

import pytest

from tests.ui.test_launch_dialog import open_dialog, probe_cache, script, settle  # noqa: F401
from trayapp.ui.launch import LaunchDialog

pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")


def places(dialog: LaunchDialog) -> Dict[str, Tuple[int, int]]:
    out = {}
    for key, widget in dialog.row_widgets.items():
        p = widget.mapTo(dialog, widget.rect().topLeft())
        out[key] = (p.x(), p.y())
    return out


def test_nothing_moves_when_the_probe_ends_or_a_problem_is_said(  # type: ignore
        qtbot, paths, start_engine, probe_cache, script) -> None:  # noqa: F811
    start_engine(demo=True)
    dialog = open_dialog(qtbot, paths, probe_cache)
    dialog.resize(1040, 900)
    dialog.choose_script(str(script))
    qtbot.wait(50)
    before = places(dialog)
    qtbot.waitUntil(lambda: "TensorFlow" in dialog.python_info.text(), timeout=120000)
    qtbot.waitUntil(lambda: not dialog.busy_row.isVisibleTo(dialog), timeout=120000)
    qtbot.waitUntil(lambda: dialog.doctor_label.text() != "", timeout=10000)  # a CPU build
    qtbot.wait(50)
    assert places(dialog) == before

    # A problem on a row, and a long one on a row without a line of its own.
    dialog.apply_preset(None)
    dialog.growth_combo.setCurrentIndex(dialog.growth_combo.findData(True))
    dialog.vram_mode.setCurrentIndex(dialog.vram_mode.findData("limit"))
    settle(dialog)
    qtbot.wait(50)
    growth = dialog.row_errors["growth"]
    assert growth.isVisibleTo(dialog) and "cannot be combined" in growth.text()
    assert growth.toolTip() == growth.text()
    assert places(dialog) == before
    dialog.growth_combo.setCurrentIndex(dialog.growth_combo.findData(None))
    dialog.ckpt_edit.setText(str(script))  # a file, not a folder
    dialog.resume_box.setChecked(True)
    settle(dialog)
    qtbot.wait(50)
    assert "not a folder" in dialog.row_errors["checkpoint"].text()
    assert dialog.row_errors["resume"] is dialog.row_errors["checkpoint"]
    assert places(dialog) == before
    dialog.ckpt_edit.clear()
    dialog.resume_box.setChecked(False)
    settle(dialog)
    qtbot.wait(50)
    assert not growth.isVisibleTo(dialog)
    assert places(dialog) == before
