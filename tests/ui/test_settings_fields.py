"""The settings window's fields come from config.SETTINGS: label, unit, kind; a new entry in
the table gets its field with nothing else to change."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QLineEdit  # noqa: E402

from trayapp import config as configmod  # noqa: E402
from trayapp.config import SETTINGS, Setting  # noqa: E402
from trayapp.engine.client import EngineClient  # noqa: E402
from trayapp.ui import settings as settings_window  # noqa: E402
from trayapp.ui import settings_fields  # noqa: E402
from trayapp.ui.settings import SettingsDialog  # noqa: E402


def test_each_field_shows_the_table_s_label_and_unit(qtbot, paths) -> None:  # type: ignore[no-untyped-def]
    dialog = SettingsDialog(lambda: EngineClient(paths, timeout=5.0))
    qtbot.addWidget(dialog)
    assert set(dialog.fields) == {s.name for s in SETTINGS}
    for s in SETTINGS:
        w = dialog.fields[s.name].widget
        assert w.accessibleName() == s.label, s.name
        if s.kind == "number":
            assert isinstance(w, QDoubleSpinBox) and w.suffix() == (f" {s.unit}" if s.unit
                                                                   else ""), s.name
        elif s.kind == "bool":
            assert isinstance(w, QCheckBox) and w.text() == s.label
        elif s.kind == "threshold":
            assert isinstance(w, QLineEdit) and dialog.fields[s.name].preview is not None
        elif s.kind == "text":
            assert isinstance(w, QLineEdit) and dialog.fields[s.name].preview is None
        else:
            assert isinstance(w, QComboBox)
            assert [w.itemData(i) for i in range(w.count())] == list(s.choices)


def test_a_new_setting_is_one_entry_in_the_table(qtbot, paths,  # type: ignore[no-untyped-def]
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    new = Setting("guard", "swap_warn_percent", 50.0, float, "Warn when swap is this full.",
                  0, 100, label="Warn when swap is above", unit="%")
    table = SETTINGS + (new,)
    monkeypatch.setattr(settings_window, "SETTINGS", table)
    monkeypatch.setattr(settings_fields, "SETTINGS_BY_NAME", {s.name: s for s in table})
    monkeypatch.setattr(configmod, "SETTINGS_BY_NAME", {s.name: s for s in table})
    dialog = SettingsDialog(lambda: EngineClient(paths, timeout=5.0))
    qtbot.addWidget(dialog)
    w = dialog.fields[new.name].widget
    assert isinstance(w, QDoubleSpinBox)
    assert w.accessibleName() == "Warn when swap is above" and w.suffix() == " %"
    assert w.maximum() == 100 and w.toolTip() == new.comment
    assert settings_fields.label_of(new.name) == "Warn when swap is above"
