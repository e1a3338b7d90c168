"""The settings dialog: the guard's thresholds (with where each sits on the RAM right now), its
prediction horizons and mode, sampling, notifications, start at login, and history.

Values come from the engine (``config_get``) and go back through it (``config_set`` per changed
value), which writes ``config.toml``. A value that is not valid shows its reason under the field
and is not sent; one the engine refuses shows the engine's reason the same way.

The file may be edited by hand while the dialog is open. Fields the user has not touched then
take the file's new values; a field the user changed that the file changed too is a conflict,
and saving asks which to keep. Every save names the version of the file it was based on, so
the engine refuses to write over an edit the dialog has not seen (``settings_conflicts``).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from trayapp import config as configmod
from trayapp.config import SETTINGS, ConfigError, Setting, Threshold
from trayapp.config.view import ConfigView
from trayapp.engine.client import EngineClient, EngineError
from trayapp.engine.status_record import Status
from trayapp.ui import autostart
from trayapp.ui.forms import (
    NOTE_STYLE,
    WARNING_STYLE,
    chain_tab_order,
    message_label,
    one_line,
    set_message,
    window_title,
)
from trayapp.ui.settings_conflicts import conflict_box, file_changes
from trayapp.ui.settings_fields import Field, label_of, make_field, same
from trayapp.ui.settings_ladder import LADDER, ThresholdBar, order_problem, threshold_preview
from trayapp.ui.worker import CallRunner

log = logging.getLogger("headroom.ui")

# Tabs and the settings on each, in the order of the form; settings not named here land on
# "Advanced", so a new entry in the table always has a field.
TABS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    (
        "Guard",
        (
            "guard.mode",
            "guard.warn_available",
            "guard.pause_available",
            "guard.park_available",
            "guard.stop_available",
            "guard.resume_available",
            "guard.warn_horizon_seconds",
            "guard.pause_horizon_seconds",
            "guard.auto_resume",
        ),
    ),
    (
        "General",
        (
            "engine.sample_interval",
            "ui.notifications",
            "ui.start_at_login",
            "ui.show_dashboard_at_start",
            "history.raw_hours",
            "history.keep_days",
        ),
    ),
    (
        "Metrics and machines",
        (
            "metrics.listen",
            "metrics.tls_cert",
            "metrics.tls_key",
            "machines.prometheus",
            "machines.refresh_seconds",
        ),
    ),
)
# What an empty text field shows, where an example says more than the label.
PLACEHOLDERS: Dict[str, str] = {
    "metrics.listen": '"9835" (this machine only) or "0.0.0.0:9835" (every network)',
    "metrics.tls_cert": "a PEM file, e.g. /etc/headroom/metrics.crt",
    "metrics.tls_key": "a PEM file, e.g. /etc/headroom/metrics.key",
    "machines.prometheus": "e.g. http://prometheus.lab:9090",
}

# What a tab says under its fields, where the fields alone would leave a user guessing.
TAB_NOTES: Dict[str, str] = {
    "Metrics and machines": (
        "A bare port serves the metrics to this machine only (127.0.0.1). For a Prometheus on "
        "another machine, give an address such as 0.0.0.0:9835, and then use TLS and a "
        "firewall: the metrics tell how much memory is free and which jobs run.\n\n"
        "The metrics are served while the engine runs, and an engine serving them keeps "
        "running when the tray and the last job have gone. After a reboot, the tray at login "
        "or the command headroom\u00a0engine starts one again.\n\n"
        "The Machines window (tray menu › Machines...) asks the Prometheus server above about "
        "every machine it scrapes."
    ),
}

# -- the dialog -----------------------------------------------------------------------------------


class SettingsDialog(QDialog):
    """``SettingsDialog(client_factory, parent=None)``; ``client_factory()`` returns a new
    EngineClient. Every engine call runs off the GUI thread.

    ``saved(ConfigView)``: the engine's settings after a save.
    """

    saved = Signal(object)

    def __init__(
        self,
        client_factory: Callable[[], EngineClient],
        parent: Optional[QWidget] = None,
        *,
        refresh_ms: int = 2000,
    ):
        super().__init__(parent)
        self.setWindowTitle(window_title("Settings"))
        self.setObjectName("settings")
        self._runner = CallRunner(client_factory, workers=1, parent=self)
        self.fields: Dict[str, Field] = {}
        self.loaded: Dict[str, Any] = {}
        self.version = ""  # the file's version the fields were loaded from (config_get's)
        # Fields the user changed that the file then changed too: name -> the file's value.
        self.file_changed: Dict[str, Any] = {}
        self.conflict_box: Optional[QMessageBox] = None
        self._retries = 0
        self._loading = False
        self.loaded_ok = False
        self.total_bytes: Optional[int] = None
        self.available_bytes: Optional[int] = None
        self._saving = False

        outer = QVBoxLayout(self)
        self.status_label = QLabel("Reading the settings from the engine…")
        self.status_label.setWordWrap(True)
        self.status_label.setAccessibleName("Settings status")
        outer.addWidget(self.status_label)
        self.problems_label = message_label(WARNING_STYLE, "Problems in the settings file")
        outer.addWidget(self.problems_label)

        self.tabs = QTabWidget()
        self.tabs.setAccessibleName("Settings sections")
        outer.addWidget(self.tabs)
        placed: set = set()
        for title, names in TABS:
            self._add_tab(title, [configmod.SETTINGS_BY_NAME[n] for n in names])
            placed.update(names)
        self._add_tab("Advanced", [s for s in SETTINGS if s.name not in placed])

        self.error_label = message_label(accessible_name="Save error")
        outer.addWidget(self.error_label)
        self.buttons = QDialogButtonBox()
        self.save_button = QPushButton("Save")
        self.save_button.setAccessibleName("Save settings")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setAccessibleName("Close without saving")
        self.buttons.addButton(self.save_button, QDialogButtonBox.ButtonRole.AcceptRole)
        self.buttons.addButton(self.cancel_button, QDialogButtonBox.ButtonRole.RejectRole)
        self.save_button.clicked.connect(self.save)
        self.cancel_button.clicked.connect(self.reject)
        outer.addWidget(self.buttons)
        self.cancel_button.setAutoDefault(False)
        self.save_button.setDefault(True)  # Enter saves

        order: List[QWidget] = [self.tabs]
        order += [f.widget for f in self.fields.values()]
        order += [self.save_button, self.cancel_button]
        chain_tab_order(order)
        self._set_enabled(False)
        self._timer = QTimer(self)
        self._timer.setInterval(refresh_ms)
        self._timer.timeout.connect(self._refresh_memory)
        self._snapshot_at = float("-inf")  # when the app last handed over a status
        self.destroyed.connect(self._runner.close)
        self.resize(700, 580)

    # -- building -------------------------------------------------------------------------------

    def _add_tab(self, title: str, settings: List[Setting]) -> None:
        page = QWidget()
        page.setAccessibleName(f"{title} settings")
        layout = QVBoxLayout(page)
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        layout.addLayout(form)
        for s in settings:
            self._add_field(form, s)
        if title == "Guard":
            self.bar = ThresholdBar()
            form.addRow("Available now", self.bar)
            self.bar.setToolTip(
                "Green: the memory available now, from none (left) to all of "
                "it (right); a tick marks each threshold."
            )
            self.order_label = message_label(WARNING_STYLE, "Threshold order")
            form.addRow("", self.order_label)
        if title in TAB_NOTES:
            note = QLabel(TAB_NOTES[title])
            note.setWordWrap(True)
            note.setAccessibleName(f"About the {title} settings")
            layout.addSpacing(12)
            layout.addWidget(note)
        layout.addStretch(1)
        self.tabs.addTab(page, title)

    def _add_field(self, form: QFormLayout, s: Setting) -> None:
        f, holder = make_field(s, self._changed)
        if s.name in PLACEHOLDERS and isinstance(f.widget, QLineEdit):
            f.widget.setPlaceholderText(PLACEHOLDERS[s.name])
        if s.kind == "bool":
            form.addRow(holder)  # the check box carries its label
        else:
            form.addRow(label_of(s.name), holder)
        self.fields[s.name] = f

    # -- loading ----------------------------------------------------------------------------------

    def _set_enabled(self, on: bool) -> None:
        self.tabs.setEnabled(on)
        self.save_button.setEnabled(on and not self._saving)

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        if not event.spontaneous():
            # Each time it opens, the dialog shows what the engine has now.
            self._load()

    def _load(self) -> None:
        self.loaded_ok = False
        self._loading = True
        self._set_enabled(False)
        set_message(self.error_label, None)
        self.status_label.setText("Reading the settings from the engine…")
        self.status_label.setStyleSheet("")
        self._runner.submit(lambda c: (c.config_get(), c.status()), self._loaded, self._load_failed)

    def _loaded(self, result: Tuple[ConfigView, Status]) -> None:
        config, status = result
        self._loading = False
        self.apply_config(config)
        self.apply_status(status)
        self.loaded_ok = True
        self._set_enabled(True)
        self._timer.start()
        self._changed()

    def _load_failed(self, message: str) -> None:
        self._loading = False
        why = one_line(message).rstrip(".")
        self.status_label.setText(
            f"The settings cannot be read: {why}. They load as soon as the engine answers."
        )
        self.status_label.setStyleSheet("color: #c0392b;")

    def apply_config(self, config: ConfigView, keep_edits: bool = False) -> None:
        """Show the engine's settings (``config_get()``'s answer) in the fields; with
        ``keep_edits``, a field the user changed keeps the user's value."""
        edited = set(self.changes()) if keep_edits else set()
        if not keep_edits:
            self.file_changed = {}
        self.version = config.version
        self.loaded = {}
        for name, f in self.fields.items():
            s = f.setting
            value = config.section(s.section).get(s.key, s.default)
            if name == "ui.start_at_login":
                value = self._autostart_state(bool(value))
            self.loaded[name] = value
            if name in edited:
                continue
            f.widget.blockSignals(True)
            f.set_value(value)
            f.widget.blockSignals(False)
            set_message(f.error, None)
        path = config.path or "config.toml"
        # Before any Save the file may not exist yet: the line names it, it claims no save.
        self.status_label.setText(f"Settings file: {path} (Save has the engine write it)")
        self.status_label.setStyleSheet(NOTE_STYLE)
        problems = [one_line(p) for p in config.problems]
        set_message(self.problems_label, "\n".join(problems))

    def _autostart_state(self, configured: bool) -> bool:
        # What happens at the next login is what the autostart entry says, not the setting.
        try:
            return autostart.is_enabled()
        except autostart.AutostartError as e:
            set_message(self.fields["ui.start_at_login"].error, str(e))
            return configured

    def apply_status(self, status: Status) -> None:
        """Take the current RAM from a status for the thresholds' preview."""
        memory = status.memory
        self.total_bytes = memory.total_bytes if memory is not None else None
        self.available_bytes = memory.available_bytes if memory is not None else None
        self._update_previews()

    # The app's hooks: its status pushes, a settings change made elsewhere, the engine's state.

    def apply_snapshot(self, status: Status) -> None:
        self._snapshot_at = time.monotonic()
        if self.loaded_ok:
            self.apply_status(status)

    def set_config(self, config: ConfigView) -> None:
        if self.loaded_ok and not self._saving:
            self._note_file_changes(config)
            self.apply_config(config, keep_edits=True)
            self._changed()
            self._show_conflicts()

    def _note_file_changes(self, config: ConfigView) -> None:
        """Before ``config`` replaces what the fields were loaded from: remember each field the
        user changed whose value the file changed too (to something else than the user's)."""
        if config.version == self.version:
            return
        self.file_changed.update(file_changes(config, self.fields, self.loaded, self.changes()))

    def _conflicts(self) -> Dict[str, Any]:
        """The user's changes that the file changed too since: name -> the file's value."""
        changes = self.changes()
        self.file_changed = {n: v for n, v in self.file_changed.items() if n in changes}
        return dict(self.file_changed)

    def _show_conflicts(self) -> None:
        conflicts = self._conflicts()
        if conflicts:
            names = ", ".join(label_of(n) for n in conflicts)
            self.status_label.setText(
                f"The settings file changed while this window was open "
                f"({names}); saving asks which values to keep."
            )
            self.status_label.setStyleSheet(WARNING_STYLE)

    def set_reachable(self, reachable: bool, reason: Optional[str] = None) -> None:
        if not reachable:
            self.status_label.setText(
                "The engine is not reachable"
                + (f": {reason}" if reason else "")
                + "; the settings cannot be saved until it is back."
            )
            self.status_label.setStyleSheet("color: #c0392b;")
        elif self.isVisible() and not self._saving:
            if self.loaded_ok:
                # Back after a gap: the engine's values again, the user's edits kept.
                self._runner.submit(lambda c: c.config_get(), self.set_config, lambda _m: None)
            elif not self._loading:
                # (A load already on its way would land after the user began editing and
                # reset the fields.)
                self._load()

    def _refresh_memory(self) -> None:
        # The app's pushes keep the preview current; without them, ask now and then.
        if time.monotonic() - self._snapshot_at < 5.0:
            return
        if self._runner.pending() == 0:
            # The settings too: a hand edit of the file shows up here without the app's pushes.
            self._runner.submit(
                lambda c: (c.status(), c.config_get()), self._refreshed, lambda _m: None
            )

    def _refreshed(self, result: Tuple[Status, ConfigView]) -> None:
        status, config = result
        self.apply_status(status)
        if config.version != self.version:  # the same bytes, the same values
            self.set_config(config)

    # -- editing ----------------------------------------------------------------------------------

    def changes(self) -> Dict[str, Any]:
        """The fields whose value differs from what the engine has."""
        return {
            name: f.value()
            for name, f in self.fields.items()
            if name in self.loaded and not same(f.value(), self.loaded[name])
        }

    def invalid(self) -> Dict[str, str]:
        """Field name -> the reason its value cannot be saved."""
        out = {}
        for name, f in self.fields.items():
            reason = f.check()
            if reason:
                out[name] = reason
        return out

    def _changed(self, *_: Any) -> None:
        bad = self.invalid()
        for name, f in self.fields.items():
            set_message(f.error, bad.get(name))
        self._update_previews()
        if self.loaded_ok:
            self.save_button.setEnabled(not bad and not self._saving)
            n = len(self.changes())
            if not self._saving:
                set_message(self.error_label, None)
            self.save_button.setText(f"Save ({n})" if n else "Save")

    def _update_previews(self) -> None:
        words = {name: word for name, word, _c in LADDER}
        colours = {name: colour for name, _w, colour in LADDER}
        marks = []
        texts: Dict[str, str] = {}
        for name, f in self.fields.items():
            if f.preview is None:
                continue
            texts[name] = str(f.value())
            word = words.get(name, "")  # a threshold off the ladder (hysteresis): only its size
            try:
                text = threshold_preview(texts[name], self.total_bytes, self.available_bytes, word)
            except ConfigError:
                f.preview.setText("")
                continue
            f.preview.setText(text)
            # Amber when the guard would act on this step right now.
            f.preview.setStyleSheet(
                WARNING_STYLE if "would" in text or "stay paused" in text else NOTE_STYLE
            )
            if word and self.total_bytes:
                b = Threshold.parse(texts[name]).bytes_of(int(self.total_bytes))
                marks.append((word, b, colours[name]))
        self.bar.set_values(self.total_bytes, self.available_bytes, marks)
        problem = order_problem(texts, int(self.total_bytes)) if self.total_bytes else None
        set_message(self.order_label, problem)

    # -- saving -----------------------------------------------------------------------------------

    def save(self) -> None:
        """Send every changed, valid value to the engine; close when all were saved. When the
        file changed a value the user changed too, ask first which to keep."""
        self._retries = 1
        self._save()

    def _save(self) -> None:
        if not self.loaded_ok or self._saving:
            return
        bad = self.invalid()
        if bad:
            self._changed()
            return
        changes = self.changes()
        if not changes:
            self.accept()
            return
        conflicts = self._conflicts()
        if conflicts:
            self._ask(conflicts)
            return
        self.apply_changes(changes)

    def _ask(self, conflicts: Dict[str, Any]) -> None:
        """Which to keep, the file's values or the user's (``conflict_box``, not blocking)."""
        box, keep, mine = conflict_box(self, conflicts, self.changes())

        def closed(*_: Any) -> None:
            if self.conflict_box is box:
                self.conflict_box = None

        def answered(button: Any) -> None:
            closed()
            if button is keep:
                for name in conflicts:
                    self._set_quietly(name, self.loaded[name])
                self.file_changed = {}
                self._changed()
                self._save()  # the other changes, if any
            elif button is mine:
                self.file_changed = {}
                self.apply_changes(self.changes())

        box.buttonClicked.connect(answered)
        box.finished.connect(closed)
        self.conflict_box = box
        box.open()

    def apply_changes(self, changes: Dict[str, Any]) -> None:
        """``config_set`` each of ``changes`` off the GUI thread; reasons for refused values
        appear under their fields; the dialog closes when every value was saved."""
        self._saving = True
        self.save_button.setEnabled(False)
        set_message(self.error_label, None)
        self.status_label.setText("Saving…")

        version: Optional[str] = self.version

        def send(client: EngineClient) -> Tuple[Dict[str, Optional[str]], ConfigView, bool]:
            refused: Dict[str, Optional[str]] = {}
            config = None
            v = version
            for name, value in changes.items():
                try:
                    config = client.config_set(name, value, version=v)
                    v = config.version
                    refused[name] = None
                except EngineError as e:
                    if e.code == "conflict":  # edited under us: nothing more is written
                        return refused, client.config_get(), True
                    refused[name] = one_line(e)
            return refused, config if config is not None else client.config_get(), False

        def done(result: Tuple[Dict[str, Optional[str]], ConfigView, bool]) -> None:
            refused, config, conflict = result
            if conflict:
                self._conflicted(config)
            else:
                self._saved(changes, refused, config)

        self._runner.submit(send, done, self._save_failed)

    def _conflicted(self, config: ConfigView) -> None:
        """The engine found the file changed since the dialog read it: take the file's values
        where the user changed nothing, then save again (asking if the file changed the user's
        own changes)."""
        self._saving = False
        self.set_config(config)
        if self._conflicts() or self._retries > 0:
            self._retries -= 1
            self._save()
            return
        self.status_label.setText("Not saved: the settings file keeps changing.")
        set_message(self.error_label, "The settings file changed while saving; save again.")

    def _saved(
        self, kept: Dict[str, Any], refused: Dict[str, Optional[str]], config: ConfigView
    ) -> None:
        self._saving = False
        self.apply_config(config)
        # Values the engine refused stay in their fields, with its reason beside them.
        for name, reason in refused.items():
            if reason and name in self.fields:
                self._set_quietly(name, kept[name])
        failed = {n: r for n, r in refused.items() if r}
        if refused.get("ui.start_at_login", "") is None:
            problem = self._apply_autostart(bool(kept["ui.start_at_login"]))
            if problem:
                failed["ui.start_at_login"] = problem
        self._changed()
        for name, reason in failed.items():
            set_message(
                self.fields[name].error if name in self.fields else self.error_label,
                reason if name in self.fields else f"{name}: {reason}",
            )
        self.saved.emit(config)
        if failed:
            set_message(
                self.error_label, f"{len(failed)} value(s) not saved; the reasons are beside them."
            )
            self.status_label.setText("The other values were saved.")
            return
        self.accept()

    def _set_quietly(self, name: str, value: Any) -> None:
        f = self.fields[name]
        f.widget.blockSignals(True)
        f.set_value(value)
        f.widget.blockSignals(False)

    def _apply_autostart(self, on: bool) -> Optional[str]:
        """Write or remove the autostart entry; returns the problem, or None."""
        try:
            autostart.set_enabled(on)
        except autostart.AutostartError as e:
            return str(e)
        self.loaded["ui.start_at_login"] = on
        self._set_quietly("ui.start_at_login", on)
        return None

    def _save_failed(self, message: str) -> None:
        self._saving = False
        self.status_label.setText("Not saved.")
        set_message(self.error_label, f"The engine did not take the settings: {one_line(message)}")
        self._changed()

    def done(self, result: int) -> None:
        self._timer.stop()
        super().done(result)
