"""One field of the settings window per setting, built from its entry in
``config.SETTINGS`` (its kind, label, unit, limits and comment)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QLabel,
    QLineEdit,
    QVBoxLayout,
    QWidget,
)

from trayapp.config import SETTINGS_BY_NAME, ConfigError, Setting
from trayapp.ui.forms import NOTE_STYLE, message_label, one_line
from trayapp.ui.model import GUARD_MODE_LABELS


def label_of(name: str) -> str:
    """The words the window shows for setting ``name``."""
    s = SETTINGS_BY_NAME.get(name)
    return s.label or name if s is not None else name


def same(a: Any, b: Any) -> bool:
    if (
        isinstance(a, (int, float))
        and isinstance(b, (int, float))
        and not isinstance(a, bool)
        and not isinstance(b, bool)
    ):
        return abs(float(a) - float(b)) < 1e-9
    if isinstance(a, str) and isinstance(b, str):
        return a.strip() == b.strip()
    return bool(a == b)


@dataclass
class Field:
    setting: Setting
    widget: QWidget
    error: QLabel
    preview: Optional[QLabel] = None

    def value(self) -> Any:
        w = self.widget
        if isinstance(w, QCheckBox):
            return w.isChecked()
        if isinstance(w, QComboBox):
            return w.currentData()
        if isinstance(w, QLineEdit):
            return w.text().strip()
        assert isinstance(w, QDoubleSpinBox)
        v = w.value()
        return int(round(v)) if isinstance(self.setting.default, int) else float(v)

    def set_value(self, value: Any) -> None:
        w = self.widget
        if isinstance(w, QCheckBox):
            w.setChecked(bool(value))
        elif isinstance(w, QComboBox):
            i = w.findData(value)
            w.setCurrentIndex(max(0, i))
        elif isinstance(w, QLineEdit):
            w.setText(str(value))
        elif isinstance(w, QDoubleSpinBox):
            try:
                w.setValue(float(value))
            except (TypeError, ValueError):
                w.setValue(float(self.setting.default))

    def check(self) -> Optional[str]:
        """The reason the value cannot be saved, or None."""
        try:
            self.setting.check(self.value())
        except ConfigError as e:
            return one_line(e)
        return None


def _widget(s: Setting, changed: Callable[..., None]) -> QWidget:
    kind = s.kind
    if kind == "bool":
        box = QCheckBox(s.label or s.name)
        box.toggled.connect(changed)
        return box
    if kind == "choice":
        combo = QComboBox()
        for word in s.choices:
            combo.addItem(GUARD_MODE_LABELS.get(word, word), word)
        combo.currentIndexChanged.connect(changed)
        return combo
    if kind in ("threshold", "text"):
        edit = QLineEdit()
        if kind == "threshold":
            edit.setPlaceholderText('a share like "15%" or a size like "2 GiB"')
        edit.textChanged.connect(changed)
        return edit
    spin = QDoubleSpinBox()
    # Hundredths only where the table allows less than one (0.02 s, 0.1 per s).
    fine = s.minimum is not None and 0 < s.minimum < 1
    spin.setDecimals(2 if fine and not isinstance(s.default, int) else 0)
    spin.setRange(
        s.minimum if s.minimum is not None else 0.0, s.maximum if s.maximum is not None else 1e9
    )
    spin.setSuffix(f" {s.unit}" if s.unit else "")
    spin.setKeyboardTracking(True)
    spin.valueChanged.connect(changed)
    return spin


def make_field(s: Setting, changed: Callable[..., None]) -> Tuple[Field, QWidget]:
    """The field for ``s`` (``changed`` called on every edit) and the widget that holds it
    with its problem line (and, for a threshold, the line saying where it sits)."""
    label = s.label or s.name
    widget = _widget(s, changed)
    widget.setAccessibleName(label)
    widget.setAccessibleDescription(s.comment)
    widget.setToolTip(s.comment)
    widget.setObjectName(s.name)
    error = message_label(accessible_name=f"{label}: problem")
    preview = None
    column = QVBoxLayout()
    column.setSpacing(2)
    column.addWidget(widget)
    if s.kind == "threshold":
        preview = QLabel()
        preview.setStyleSheet(NOTE_STYLE)
        preview.setAccessibleName(f"{label}: on this machine")
        column.addWidget(preview)
    column.addWidget(error)
    holder = QWidget()
    holder.setLayout(column)
    column.setContentsMargins(0, 0, 0, 0)
    return Field(s, widget, error, preview), holder
