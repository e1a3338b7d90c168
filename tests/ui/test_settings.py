"""The settings dialog against a real engine on a temporary HEADROOM_HOME."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QDialog  # noqa: E402

from trayapp import config as configmod  # noqa: E402
from trayapp.config import format_bytes  # noqa: E402
from trayapp.engine.client import EngineClient  # noqa: E402
from trayapp.engine.status_record import Status
from trayapp.ui.settings import SettingsDialog, order_problem, threshold_preview  # noqa: E402

GiB = 1024**3

# The offscreen platform cannot pass size hints to a window manager; it says so on every show.
pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")


@pytest.fixture
def xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg"


def open_dialog(qtbot, paths) -> SettingsDialog:  # type: ignore[no-untyped-def]
    dialog = SettingsDialog(lambda: EngineClient(paths, timeout=5.0))
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitUntil(lambda: dialog.loaded_ok, timeout=15000)
    return dialog


def test_threshold_preview_says_where_it_sits() -> None:
    assert threshold_preview("10%", 16 * GiB, 8 * GiB, "warn") == \
        "= 1.6 GiB of 16.0 GiB; 8.0 GiB available now, above it"
    assert threshold_preview("10 GiB", 16 * GiB, 8 * GiB, "pause") == \
        "= 10.0 GiB of 16.0 GiB; 8.0 GiB available now, below it: the guard would pause now"
    assert threshold_preview("60%", 16 * GiB, 8 * GiB, "resume").endswith(
        "below it: paused jobs stay paused")
    with pytest.raises(configmod.ConfigError):
        threshold_preview("lots", 16 * GiB, 8 * GiB, "warn")


def test_order_problem() -> None:
    good = {"guard.park_available": "5%", "guard.pause_available": "8%",
            "guard.warn_available": "15%", "guard.resume_available": "20%"}
    assert order_problem(good, 16 * GiB) is None
    assert "park ≤ pause ≤ warn" in (order_problem(
        dict(good, **{"guard.park_available": "10%"}), 16 * GiB) or "")
    assert "Resume sits below pause" in (order_problem(
        dict(good, **{"guard.resume_available": "1 GiB"}), 16 * GiB) or "")


def test_settings_round_trip(qtbot, paths, start_engine, xdg) -> None:  # type: ignore[no-untyped-def]
    engine = start_engine()
    dialog = open_dialog(qtbot, paths)
    assert "Settings" in dialog.windowTitle() and "Headroom" in dialog.windowTitle()
    assert dialog.fields["guard.warn_available"].value() == "15%"
    assert dialog.fields["ui.start_at_login"].value() is False
    # The preview uses the engine's total RAM.
    with engine.client() as c:
        total = c.status().memory.total_bytes
    preview = dialog.fields["guard.warn_available"].preview
    assert preview is not None
    assert preview.text().startswith(f"= {format_bytes(total * 0.15)} of {format_bytes(total)}")

    dialog.fields["guard.warn_available"].widget.setText("12%")
    dialog.fields["engine.sample_interval"].widget.setValue(0.5)
    dialog.fields["ui.notifications"].widget.setChecked(False)
    dialog.fields["ui.start_at_login"].widget.setChecked(True)
    dialog.fields["guard.mode"].widget.setCurrentIndex(
        dialog.fields["guard.mode"].widget.findData("dry-run"))
    assert set(dialog.changes()) == {"guard.warn_available", "engine.sample_interval",
                                     "ui.notifications", "ui.start_at_login", "guard.mode"}
    assert dialog.save_button.text() == "Save (5)"
    with qtbot.waitSignal(dialog.finished, timeout=15000):
        qtbot.mouseClick(dialog.save_button, Qt.MouseButton.LeftButton)
    assert dialog.result() == QDialog.DialogCode.Accepted

    saved = configmod.load(paths.config_file)
    assert saved.problems == []
    assert saved["guard.warn_available"] == "12%"
    assert saved["engine.sample_interval"] == 0.5
    assert saved["ui.notifications"] is False
    assert saved["ui.start_at_login"] is True
    assert saved["guard.mode"] == "dry-run"
    assert saved["guard.pause_available"] == "8%"  # untouched values keep their defaults
    with engine.client() as c:
        assert c.config_get().value("guard.warn_available") == "12%"
    assert (xdg / "autostart" / "headroom.desktop").exists()

    # A new dialog shows what was saved; switching start at login off removes the entry.
    again = open_dialog(qtbot, paths)
    assert again.fields["guard.warn_available"].value() == "12%"
    assert again.fields["engine.sample_interval"].value() == 0.5
    assert again.fields["ui.start_at_login"].value() is True
    assert again.changes() == {}
    again.fields["ui.start_at_login"].widget.setChecked(False)
    with qtbot.waitSignal(again.finished, timeout=15000):
        again.save()
    assert not (xdg / "autostart" / "headroom.desktop").exists()
    assert configmod.load(paths.config_file)["ui.start_at_login"] is False


def test_invalid_value_shows_reason_and_is_not_saved(qtbot, paths,  # type: ignore[no-untyped-def]
                                                     start_engine, xdg) -> None:
    start_engine()
    dialog = open_dialog(qtbot, paths)
    field = dialog.fields["guard.warn_available"]
    field.widget.setText("lots")
    assert field.error.isVisibleTo(dialog)
    assert "is not a percentage like" in field.error.text()
    assert not dialog.save_button.isEnabled()
    dialog.save()  # refused before anything is sent
    assert dialog.isVisible()
    assert not paths.config_file.exists()

    field.widget.setText("15%")
    assert not field.error.isVisibleTo(dialog)
    assert dialog.save_button.isEnabled()


def test_value_refused_by_engine_shows_its_reason(qtbot, paths,  # type: ignore[no-untyped-def]
                                                  start_engine, xdg) -> None:
    start_engine()
    dialog = open_dialog(qtbot, paths)
    # Sent as if it had passed the dialog's own check: the engine's reason is shown instead.
    dialog.apply_changes({"guard.pause_available": "150%", "history.keep_days": 7.0})
    field = dialog.fields["guard.pause_available"]
    qtbot.waitUntil(lambda: field.error.isVisibleTo(dialog), timeout=15000)
    assert "not between 0% and 100%" in field.error.text()
    assert dialog.isVisible()
    assert field.value() == "150%"
    assert "1 value(s) not saved" in dialog.error_label.text()
    saved = configmod.load(paths.config_file)
    assert saved["guard.pause_available"] == "8%"
    assert saved["history.keep_days"] == 7.0


def test_no_engine_says_so(qtbot, paths) -> None:  # type: ignore[no-untyped-def]
    dialog = SettingsDialog(lambda: EngineClient(paths, timeout=2.0))
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitUntil(lambda: "cannot be read" in dialog.status_label.text(), timeout=10000)
    assert "no engine is running" in dialog.status_label.text()
    assert not dialog.save_button.isEnabled()
    assert not dialog.loaded_ok


def test_keyboard_and_names(qtbot, paths, start_engine, xdg) -> None:  # type: ignore[no-untyped-def]
    start_engine()
    dialog = open_dialog(qtbot, paths)
    for name, f in dialog.fields.items():
        assert f.widget.accessibleName(), name
    assert dialog.save_button.isDefault()
    # Esc closes without saving.
    dialog.fields["guard.warn_available"].widget.setText("11%")
    with qtbot.waitSignal(dialog.finished, timeout=5000):
        qtbot.keyClick(dialog, Qt.Key.Key_Escape)
    assert dialog.result() == QDialog.DialogCode.Rejected
    assert not paths.config_file.exists()
    # Enter in a field saves.
    again = open_dialog(qtbot, paths)
    edit = again.fields["guard.warn_available"].widget
    edit.setFocus()
    edit.setText("11%")
    with qtbot.waitSignal(again.finished, timeout=15000):
        qtbot.keyClick(edit, Qt.Key.Key_Return)
    assert again.result() == QDialog.DialogCode.Accepted
    assert configmod.load(paths.config_file)["guard.warn_available"] == "11%"


def test_reopened_dialog_reads_again(qtbot, paths, start_engine, xdg) -> None:  # type: ignore
    engine = start_engine()
    dialog = open_dialog(qtbot, paths)
    dialog.fields["guard.warn_available"].widget.setText("33%")
    dialog.reject()  # closed without saving: the edit is dropped
    with engine.client() as c:
        c.config_set("history.keep_days", 12.0)  # changed elsewhere (the CLI, the file)
    dialog.show()
    qtbot.waitUntil(lambda: dialog.loaded_ok, timeout=15000)
    assert dialog.fields["guard.warn_available"].value() == "15%"
    assert dialog.fields["history.keep_days"].value() == 12.0
    # A change pushed by the app while the dialog is open keeps the user's own edits.
    dialog.fields["guard.pause_available"].widget.setText("9%")
    with engine.client() as c:
        config = c.config_set("guard.mode", "dry-run")
    dialog.set_config(config)
    assert dialog.fields["guard.mode"].value() == "dry-run"
    assert dialog.fields["guard.pause_available"].value() == "9%"
    assert dialog.changes() == {"guard.pause_available": "9%"}
    # The app's status pushes move the preview.
    status = Status.from_json({"memory": {"total_bytes": 16 * GiB, "available_bytes": GiB}})
    dialog.apply_snapshot(status)
    preview = dialog.fields["guard.pause_available"].preview
    assert preview is not None
    assert preview.text() == ("= 1.4 GiB of 16.0 GiB; 1.0 GiB available now, below it: the "
                              "guard would pause now")
