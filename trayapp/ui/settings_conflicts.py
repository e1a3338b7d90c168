"""The settings dialog and a settings file edited by hand while it is open: the file's value of
a setting, the user's changes that the file changed too (the conflicts), and the question
which of them to keep.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QPushButton, QWidget

from trayapp.config.view import ConfigView
from trayapp.ui.forms import window_title
from trayapp.ui.settings_fields import Field, label_of, same


def file_value(field: Field, loaded: Dict[str, Any], config: ConfigView, name: str) -> Any:
    """The value ``config`` (``config_get()``'s answer) gives setting ``name``."""
    s = field.setting
    if name == "ui.start_at_login":
        return loaded.get(name)  # the autostart entry decides, not the file
    return config.section(s.section).get(s.key, s.default)


def file_changes(
    config: ConfigView,
    fields: Dict[str, Field],
    loaded: Dict[str, Any],
    changes: Dict[str, Any],
) -> Dict[str, Any]:
    """Each of the user's ``changes`` whose value the file changed too (from ``loaded`` to
    something else than the user's): name -> the file's value."""
    out: Dict[str, Any] = {}
    for name, mine in changes.items():
        theirs = file_value(fields[name], loaded, config, name)
        if not same(theirs, loaded[name]) and not same(theirs, mine):
            out[name] = theirs
    return out


def conflict_box(
    parent: QWidget, conflicts: Dict[str, Any], changes: Dict[str, Any]
) -> Tuple[QMessageBox, QPushButton, QPushButton]:
    """The question which to keep, the file's values or the user's; with its "keep the
    file's" and "overwrite with mine" buttons."""
    lines = [
        f"{label_of(n)}: the file says {v!r}, this window {changes[n]!r}"
        for n, v in conflicts.items()
    ]
    box = QMessageBox(
        QMessageBox.Icon.Question,
        window_title("Settings"),
        "The settings file changed since this window read it:\n\n"
        + "\n".join(lines)
        + "\n\nWhich values should it keep?",
        QMessageBox.StandardButton.NoButton,
        parent,
    )
    keep = box.addButton("Keep the file's values", QMessageBox.ButtonRole.AcceptRole)
    mine = box.addButton("Overwrite with mine", QMessageBox.ButtonRole.DestructiveRole)
    box.addButton(QMessageBox.StandardButton.Cancel)
    box.setDefaultButton(keep)
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    return box, keep, mine
