"""The settings dialog while config.toml is edited by hand under it (real engine, real Qt):
untouched fields follow the file, and a value the user changed that the file changed too is
never written over without asking."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtWidgets import QDialog, QMessageBox  # noqa: E402

from trayapp import config as configmod  # noqa: E402
from trayapp.config import Paths  # noqa: E402
from trayapp.engine.client import EngineClient  # noqa: E402
from trayapp.ui.settings import SettingsDialog  # noqa: E402

pytestmark = pytest.mark.qt_log_ignore(
    r"This plugin does not support (propagateSizeHints|raise)\(\)",
    r"No such signal QPlatformNativeInterface::systemTrayWindowChanged")

START = "# my notes\n[guard]\npause_available = \"8%\"\nwarn_available = \"15%\"\n"


@pytest.fixture
def xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg"


def hand_edit(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".swp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def open_dialog(qtbot: Any, paths: Paths, refresh_ms: int = 2000) -> SettingsDialog:
    dialog = SettingsDialog(lambda: EngineClient(paths, timeout=5.0), refresh_ms=refresh_ms)
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitUntil(lambda: dialog.loaded_ok, timeout=15000)
    return dialog


def value(dialog: SettingsDialog, name: str) -> Any:
    return dialog.fields[name].value()


@pytest.fixture
def started(paths: Paths, start_engine: Any, xdg: Path) -> Paths:
    paths.ensure()
    paths.config_file.write_text(START, encoding="utf-8")
    start_engine()
    return paths


def test_untouched_fields_follow_a_hand_edit(qtbot: Any, started: Paths) -> None:
    dialog = open_dialog(qtbot, started, refresh_ms=200)
    assert value(dialog, "guard.pause_available") == "8%"
    hand_edit(started.config_file, START.replace("8%", "10%"))
    qtbot.waitUntil(lambda: value(dialog, "guard.pause_available") == "10%", timeout=15000)
    assert dialog.changes() == {}
    with qtbot.waitSignal(dialog.finished, timeout=5000):
        dialog.save()  # nothing to save: closes, writes nothing
    assert started.config_file.read_text(encoding="utf-8") == START.replace("8%", "10%")


def conflict(qtbot: Any, paths: Paths) -> SettingsDialog:
    """A dialog whose user changed pause to 9% while the file changed it to 10% (and warn to
    14%), with Save clicked at once: the question is up and nothing was written."""
    dialog = open_dialog(qtbot, paths)  # no refresh meanwhile: the save finds the change
    dialog.fields["guard.pause_available"].widget.setText("9%")
    edited = START.replace("8%", "10%").replace("15%", "14%")
    hand_edit(paths.config_file, edited)
    dialog.save()
    qtbot.waitUntil(lambda: getattr(dialog, "conflict_box", None) is not None
                    or not dialog.isVisible(), timeout=15000)
    assert paths.config_file.read_text(encoding="utf-8") == edited, \
        "the window wrote over the hand edit without asking"
    box = dialog.conflict_box
    assert box is not None and box.isVisible()
    assert "the file says '10%', this window '9%'" in box.text()
    # The field the user did not touch took the file's value meanwhile.
    assert value(dialog, "guard.warn_available") == "14%"
    assert value(dialog, "guard.pause_available") == "9%"
    return dialog


def click(box: QMessageBox, text: str) -> None:
    button = next(b for b in box.buttons() if b.text() == text)
    button.click()


def test_keep_the_files_values(qtbot: Any, started: Paths) -> None:
    dialog = conflict(qtbot, started)
    box = dialog.conflict_box
    assert box is not None
    with qtbot.waitSignal(dialog.finished, timeout=15000):
        click(box, "Keep the file's values")
    assert dialog.result() == QDialog.DialogCode.Accepted
    assert value(dialog, "guard.pause_available") == "10%"
    saved = configmod.load(started.config_file)
    assert saved["guard.pause_available"] == "10%" and saved["guard.warn_available"] == "14%"
    assert "# my notes" in started.config_file.read_text(encoding="utf-8")


def test_overwrite_with_mine_keeps_the_files_other_edits(qtbot: Any, started: Paths) -> None:
    dialog = conflict(qtbot, started)
    box = dialog.conflict_box
    assert box is not None
    with qtbot.waitSignal(dialog.finished, timeout=15000):
        click(box, "Overwrite with mine")
    assert dialog.result() == QDialog.DialogCode.Accepted
    saved = configmod.load(started.config_file)
    assert saved["guard.pause_available"] == "9%"
    assert saved["guard.warn_available"] == "14%"  # the hand edit of another key stays
    assert "# my notes" in started.config_file.read_text(encoding="utf-8")


def test_cancel_writes_nothing_and_keeps_the_window(qtbot: Any, started: Paths) -> None:
    dialog = conflict(qtbot, started)
    box = dialog.conflict_box
    assert box is not None
    before = started.config_file.read_text(encoding="utf-8")
    box.button(QMessageBox.StandardButton.Cancel).click()
    qtbot.waitUntil(lambda: dialog.conflict_box is None, timeout=5000)
    assert dialog.isVisible() and value(dialog, "guard.pause_available") == "9%"
    assert started.config_file.read_text(encoding="utf-8") == before


def test_an_edit_of_another_key_is_saved_around_without_asking(qtbot: Any,
                                                               started: Paths) -> None:
    dialog = open_dialog(qtbot, started)
    dialog.fields["guard.pause_available"].widget.setText("9%")
    hand_edit(started.config_file, START.replace("15%", "14%"))
    with qtbot.waitSignal(dialog.finished, timeout=15000):
        dialog.save()
    assert dialog.conflict_box is None
    saved = configmod.load(started.config_file)
    assert saved["guard.pause_available"] == "9%" and saved["guard.warn_available"] == "14%"


def test_the_apps_settings_window_follows_a_hand_edit_through_the_pushes(
        qtbot: Any, started: Paths, app_on: Any) -> None:
    app = app_on()
    app.start()
    dialog = app.open_window("settings")
    assert isinstance(dialog, SettingsDialog)
    qtbot.waitUntil(lambda: dialog.loaded_ok, timeout=15000)
    qtbot.waitUntil(lambda: app.status is not None, timeout=15000)
    dialog.fields["guard.warn_available"].widget.setText("16%")
    hand_edit(started.config_file, START.replace("8%", "11%").replace("15%", "13%"))
    qtbot.waitUntil(lambda: value(dialog, "guard.pause_available") == "11%", timeout=15000)
    assert dialog.file_changed == {"guard.warn_available": "13%"}
    assert "changed while this window was open" in dialog.status_label.text()
    dialog.reject()
