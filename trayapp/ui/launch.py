"""The launch dialog: a training script, its interpreter, the GPU and the memory options, with a
plain-language summary of what they mean, validated as they change, handed to the engine.

The spec is built and checked by ``trayapp.jobs.options`` (the same rules as ``headroom run``);
the GPUs come from the engine's status, never from a probe here. Interpreters are discovered and
probed on background threads; the last settings used for a script come back when it is chosen
again (``launch-recent.json`` in the state folder). What code writes into the form is in
``launch_fill``; a kernel spec is written by ``launch_kernel``.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QShowEvent
from PySide6.QtWidgets import QFileDialog, QLineEdit, QWidget

from trayapp.config import get_paths
from trayapp.config import load as load_config
from trayapp.engine.client import EngineClient
from trayapp.engine.status_record import Status
from trayapp.jobs import kernelspec as ks
from trayapp.jobs import options as opts
from trayapp.jobs import plan as planmod
from trayapp.jobs import spec_values as sv
from trayapp.jobs.options import JobSpec, MemoryOptions, SpecError
from trayapp.jobs.record import JobRecord
from trayapp.jsonvalue import JSONObject
from trayapp.readings import GpuReading
from trayapp.ui.background import Background
from trayapp.ui.forms import ERROR_STYLE, one_line, set_message, window_title
from trayapp.ui.launch_fill import clear_form, fill_gpus, fill_options
from trayapp.ui.launch_form import KERNEL_BUTTON, LaunchForm, select
from trayapp.ui.launch_kernel import install_kernel_spec
from trayapp.ui.launch_plan import (
    RecentLaunches,
    engine_plan,
    form_row,
    mib_text,
    summary_text,
)
from trayapp.ui.launch_python import InterpreterChoice, cpu_tensorflow
from trayapp.ui.worker import CallRunner

log = logging.getLogger("headroom.ui")

RECENT_FILE = "launch-recent.json"
PROBE_TIMEOUT = 90.0
INVALID_STYLE = "border: 1px solid #c0392b;"


class LaunchDialog(LaunchForm):
    """``LaunchDialog(client_factory, parent=None)``; ``client_factory()`` returns a new
    EngineClient. ``state_dir`` (default: the state folder) holds the recent launches and the
    interpreter cache.

    ``launched(dict)``: the engine's dict of the job it started.
    """

    launched = Signal(object)

    def __init__(
        self,
        client_factory: Callable[[], EngineClient],
        parent: Optional[QWidget] = None,
        *,
        state_dir: Optional[Path] = None,
        probe_cache: Optional[Path] = None,
        probe_timeout: float = PROBE_TIMEOUT,
    ):
        super().__init__(parent)
        self.setWindowTitle(window_title("Launch training"))
        self.setObjectName("launch")
        self.setAcceptDrops(True)
        self.paths = get_paths()
        self.state_dir = state_dir or self.paths.data_dir
        self.recent_store = RecentLaunches(self.state_dir / RECENT_FILE)
        self.probe_cache = probe_cache or self.state_dir / "cache"
        self.probe_timeout = probe_timeout
        self._runner = CallRunner(client_factory, workers=1, parent=self)
        self._background = Background(self)
        self.destroyed.connect(self._runner.close)
        self.destroyed.connect(self._background.close)
        self.status: Status = Status(0.0, None)
        self.status_loaded = False
        self.spec: Optional[JobSpec] = None  # the valid spec, or None
        self.warnings: List[str] = []
        self.error: Optional[SpecError] = None
        # The environment the job starts from, sent with the launch and shown by the plan: one
        # for both, so "Show command" is what is launched (the engine's own otherwise).
        self.environ: Dict[str, str] = dict(os.environ)
        self.launching = False
        self.installing_kernel = False
        self._filling = False  # the form is being filled by code, not by the user
        self._script_loaded: Optional[str] = None
        self._wanted_gpu: Optional[int] = None  # a remembered GPU, until the GPUs are known
        self._shown_before = False
        self.row_errors = {}
        self.row_widgets = {}
        self._build(self.recent_store.recent())
        self.python_choice = InterpreterChoice(
            self.python_combo,
            self.python_info,
            self.busy_row,
            self.probe_label,
            self.doctor_label,
            self._background,
            cache=self.probe_cache,
            timeout=self.probe_timeout,
            on_change=self._changed,
            status=lambda: self.status,
        )
        self._connect()
        self._revalidate_timer = QTimer(self)
        self._revalidate_timer.setSingleShot(True)
        self._revalidate_timer.setInterval(120)
        self._revalidate_timer.timeout.connect(self.revalidate)
        self.reset_options()
        recent = self.recent_store.recent()
        if recent and os.path.isfile(recent[0]):
            # The last script launched, with its settings: the common case is launching again.
            self.choose_script(recent[0])
        self.revalidate()
        self._runner.submit(lambda c: c.status(), self._got_status, self._status_failed)

    # -- building -------------------------------------------------------------------------------

    def _connect(self) -> None:
        """What the form's widgets do."""
        script_edit = self.script_combo.lineEdit()
        assert script_edit is not None  # an editable combo has one
        self.script_combo.activated.connect(
            lambda _i: self.choose_script(self.script_combo.currentText())
        )
        script_edit.editingFinished.connect(
            lambda: self.choose_script(self.script_combo.currentText())
        )
        self.script_combo.editTextChanged.connect(lambda _t: self._changed())
        self.script_browse.clicked.connect(self._browse_script)
        self.cwd_browse.clicked.connect(lambda: self._browse_folder(self.cwd_edit))
        self.python_combo.currentIndexChanged.connect(lambda _i: self.python_choice.changed())
        self.python_browse.clicked.connect(self._browse_python)
        self.preset_combo.activated.connect(
            lambda _i: self.apply_preset(self.preset_combo.currentData())
        )
        for box in (
            self.gpu_combo,
            self.growth_combo,
            self.vram_mode,
            self.allocator_combo,
            self.precision_combo,
            self.xla_combo,
        ):
            box.currentIndexChanged.connect(lambda _i: self._option_changed())
        for spin in (self.vram_spin, self.intra_spin, self.inter_spin):
            spin.valueChanged.connect(lambda _v: self._option_changed())
        self.env_edit.textChanged.connect(self._changed)
        for edit in (self.ram_budget_edit, self.vram_budget_edit, self.ckpt_edit):
            edit.textChanged.connect(lambda _t: self._changed())
        for check in (self.manual_resume_box, self.resume_box, self.fresh_box):
            check.toggled.connect(lambda _c: self._changed())
        self.ckpt_every_spin.valueChanged.connect(lambda _v: self._changed())
        self.ckpt_browse.clicked.connect(lambda: self._browse_folder(self.ckpt_edit))
        self.plan_button.toggled.connect(self.show_plan)
        self.launch_button.clicked.connect(self.launch)
        self.kernel_button.clicked.connect(self.install_kernel)
        self.cancel_button.clicked.connect(self.reject)

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        if event.spontaneous():
            return
        if self._shown_before:
            # Opened again (the app keeps the dialog): recent scripts and files may have
            # changed, and the engine may have come back.
            self._refresh_recent()
            self.revalidate()
            if not self.status_loaded:
                self._runner.submit(lambda c: c.status(), self._got_status, self._status_failed)
        self._shown_before = True

    def _refresh_recent(self) -> None:
        text = self.script_combo.currentText()
        self._filling = True
        try:
            self.script_combo.clear()
            for path in self.recent_store.recent():
                self.script_combo.addItem(path, path)
            self.script_combo.setCurrentIndex(-1)
            self.script_combo.setEditText(text)
        finally:
            self._filling = False

    # -- the engine's status ------------------------------------------------------------------

    def _got_status(self, status: Status) -> None:
        self.apply_snapshot(status)

    def _status_failed(self, message: str) -> None:
        self.status_loaded = False
        self.gpu_combo.setItemText(0, "GPUs unknown: the engine is not reachable")
        set_message(self.engine_label, f"The engine is not reachable: {one_line(message)}")
        self._update_launch_button()

    def apply_snapshot(self, status: Status) -> None:
        """Take the GPUs (with their free memory) and the RAM total from a status."""
        first = not self.status_loaded
        self.status = status
        self.status_loaded = True
        self._fill_gpus()
        if first:
            if self.engine_label.text().startswith("The engine is not reachable"):
                set_message(self.engine_label, None)
            # A preset depends on the GPUs (a display GPU gets a reserve, not growth).
            if self.preset_combo.currentData() is not None:
                self.apply_preset(self.preset_combo.currentData())
            self.python_choice.refresh_doctor()
            self.revalidate()

    def set_reachable(self, reachable: bool, reason: Optional[str] = None) -> None:
        if not reachable:
            set_message(
                self.engine_label,
                "The engine is not reachable"
                + (f": {reason}" if reason else "")
                + "; launching needs it.",
            )
        elif self.engine_label.text().startswith("The engine is not reachable"):
            set_message(self.engine_label, None)
        self._update_launch_button()

    def gpus(self) -> Tuple[GpuReading, ...]:
        return self.status.gpus

    def ram_total(self) -> Optional[int]:
        return self.status.memory.total_bytes if self.status.memory is not None else None

    def _fill_gpus(self) -> None:
        self._filling = True
        try:
            self._wanted_gpu = fill_gpus(self.gpu_combo, self.status, self._wanted_gpu)
        finally:
            self._filling = False

    # -- the script -----------------------------------------------------------------------------

    def _browse_script(self) -> None:
        start = os.path.dirname(self.script_combo.currentText()) or str(Path.home())
        path, _ = QFileDialog.getOpenFileName(
            self, "Choose a training script", start, "Python scripts (*.py);;All files (*)"
        )
        if path:
            self.choose_script(path)

    def _browse_folder(self, edit: QLineEdit) -> None:
        start = edit.text() or os.path.dirname(self.script_combo.currentText()) or str(Path.home())
        path = QFileDialog.getExistingDirectory(self, "Choose a folder", start)
        if path:
            edit.setText(path)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 - Qt's name
        urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
        if urls and urls[0].isLocalFile():
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 - Qt's name
        urls = event.mimeData().urls()
        if urls and urls[0].isLocalFile():
            self.choose_script(urls[0].toLocalFile())
            event.acceptProposedAction()

    def choose_script(self, path: str) -> None:
        """Take ``path`` as the script: the settings last used for it come back, its
        interpreters are discovered and probed in the background."""
        path = path.strip()
        if not path:
            return
        path = os.path.abspath(os.path.expanduser(path))
        if path == self._script_loaded:
            return
        self._script_loaded = path
        self._filling = True
        try:
            self.script_combo.setEditText(path)
            remembered = self.recent_store.spec_for(path)
            if remembered is not None:
                try:
                    self.fill_from_spec(JobSpec.from_json(remembered))
                except SpecError as e:
                    log.info("ignoring remembered settings for %s: %s", path, e)
                    remembered = None
            if remembered is None:
                self.reset_options(keep_script=True)
        finally:
            self._filling = False
        self.python_choice.discover(path)
        self.revalidate()

    # -- interpreters -----------------------------------------------------------------------------

    def python_path(self) -> Optional[str]:
        """The interpreter the job will run in (the automatic choice resolved)."""
        return self.python_choice.path()

    def _browse_python(self) -> None:
        start = os.path.dirname(self.python_path() or "") or str(Path.home())
        flt = "Python (python*.exe);;All files (*)" if sys.platform == "win32" else "All files (*)"
        path, _ = QFileDialog.getOpenFileName(self, "Choose a Python interpreter", start, flt)
        if path:
            self.use_python(path)

    def use_python(self, path: str) -> None:
        """Choose the interpreter at ``path`` (added to the list and probed)."""
        self.python_choice.use(path)

    # -- presets and the form ---------------------------------------------------------------------

    def reset_options(self, keep_script: bool = False) -> None:
        """The form's defaults: the desktop-safe preset, no checkpoints, no variables."""
        self._filling = True
        try:
            clear_form(self, keep_script)
        finally:
            self._filling = False
        self.apply_preset("desktop-safe")

    def apply_preset(self, name: Optional[str]) -> None:
        """Fill the memory options (and the RAM budget) from preset ``name``; None keeps the
        form as it is, as "Custom"."""
        self._filling = True
        try:
            select(self.preset_combo, name)
            if name is None:
                return
            try:
                budget = sv.parse_mb("--ram-budget", self.ram_budget_edit.text(), sv.RAM_BUDGET)
            except SpecError:
                budget = None
            # Presets fill only what is unset: a RAM budget already given stays.
            base = JobSpec(
                script=self.script() or "script.py",
                ram_budget_mb=budget,
                options=MemoryOptions(gpus=None if name == "cpu-only" else self._gpu_choice()[0]),
            )
            try:
                result = opts.apply_preset(base, name, self.gpus(), self.ram_total())
            except SpecError as e:
                set_message(self.row_errors["preset"], one_line(e))
                return
            self._fill_options(result.options)
            self.ram_budget_edit.setText(mib_text(result.ram_budget_mb))
        finally:
            self._filling = False
        self._changed()

    def _fill_options(self, o: MemoryOptions) -> None:
        self._wanted_gpu = fill_options(self, o)

    def fill_from_spec(self, spec: JobSpec) -> None:
        """Show ``spec`` in the form (the settings remembered for a script)."""
        self._filling = True
        try:
            self.script_combo.setEditText(spec.script)
            self.args_edit.setText(shlex.join(spec.args))
            script_dir = os.path.dirname(os.path.abspath(spec.script))
            self.cwd_edit.setText("" if not spec.cwd or spec.cwd == script_dir else spec.cwd)
            self.name_edit.setText(spec.name or "")
            self.python_choice.show_spec_python(spec.python)
            self.env_edit.setPlainText("\n".join(f"{k}={v}" for k, v in spec.env))
            self._fill_options(spec.options)
            select(self.preset_combo, spec.preset)
            self.ram_budget_edit.setText(mib_text(spec.ram_budget_mb))
            self.vram_budget_edit.setText(mib_text(spec.vram_budget_mb))
            self.manual_resume_box.setChecked(spec.auto_resume is False)
            select(self.on_oom_combo, spec.on_oom)
            self.min_batch_spin.setValue(spec.min_batch or sv.MIN_BATCH_DEFAULT)
            self.fit_batch_box.setChecked(spec.fit_batch)
            self.ckpt_edit.setText(spec.checkpoint_dir or "")
            self.ckpt_every_spin.setValue(spec.checkpoint_every_steps or 0)
            self.resume_box.setChecked(spec.resume)
            self.fresh_box.setChecked(spec.fresh)
        finally:
            self._filling = False
        self._changed()

    def _option_changed(self) -> None:
        # A memory option changed by hand: the form no longer is the preset.
        if not self._filling and self.preset_combo.currentData() is not None:
            select(self.preset_combo, None)
        self.vram_spin.setEnabled(self.vram_mode.currentData() != "none")
        self._changed()

    def _changed(self) -> None:
        if not self._filling:
            self._revalidate_timer.start()

    # -- the spec ---------------------------------------------------------------------------------

    def revalidate(self) -> Optional[JobSpec]:
        """Check the form: marks the field at fault with its reason, updates the summary and
        the warnings, and enables Launch only for a valid spec. Returns the valid spec."""
        self._revalidate_timer.stop()
        for key, label in self.row_errors.items():
            set_message(label, None)
            self.row_widgets[key].setStyleSheet("")
        self.spec, self.warnings, self.error = None, [], None
        try:
            spec = self.form_spec()
            warnings = opts.validate(spec, self.gpus(), check_paths=True)
        except SpecError as e:
            self._show_error(e)
        else:
            self.spec, self.warnings = spec, list(warnings)
        self._show_state()
        return self.spec

    def _show_error(self, error: SpecError) -> None:
        self.error = error
        key = form_row(error)
        if key == "script" and not self.script():
            return  # nothing chosen yet: not an error, only a missing field
        if key is not None and key in self.row_errors:
            set_message(self.row_errors[key], str(error))
            widget = self.row_widgets[key]
            widget.setStyleSheet(f"{type(widget).__name__} {{{INVALID_STYLE}}}")

    def _show_state(self) -> None:
        env_lines = [
            w for w in self.warnings if "--env" in w or w.startswith("TensorFlow does not read")
        ]
        other = [w for w in self.warnings if w not in env_lines]
        set_message(self.env_warning, "\n".join(f"⚠ {w}" for w in env_lines))
        set_message(self.warnings_label, "\n".join(f"⚠ {w}" for w in other))
        if self.spec is not None:
            self.summary_label.setText(
                summary_text(
                    self.spec,
                    self.gpus(),
                    self.ram_total(),
                    cpu_tensorflow=cpu_tensorflow(self.python_choice.chosen()),
                )
            )
        elif not self.script():
            self.summary_label.setText(
                "Choose a training script to launch (Browse…, a recent "
                "one, or drop a .py file here)."
            )
        else:
            self.summary_label.setText("Fix the field marked in red to launch.")
        unplaced = self.error is not None and form_row(self.error) not in self.row_errors
        set_message(self.error_label, str(self.error) if unplaced else None)
        if self.plan_view.isVisible():
            self._fill_plan()
        self._update_launch_button()

    def _update_launch_button(self) -> None:
        self.launch_button.setEnabled(
            self.spec is not None and not self.launching and self.status_loaded
        )

    # -- the plan ---------------------------------------------------------------------------------

    def show_plan(self, on: bool = True) -> None:
        """Show (or hide) the launch plan: the command and environment the job would get."""
        self.plan_button.setChecked(on)
        self.plan_view.setVisible(on)
        self.plan_button.setText("Hide command" if on else "Show command")
        if on:
            self._fill_plan()

    def launch_plan(self, spec: JobSpec) -> planmod.LaunchPlan:
        """The plan the engine makes of ``spec`` when this dialog launches it: the same
        environment (``self.environ``, sent with the launch), GPUs and settings file. Raises
        SpecError (or ValueError) for a spec the engine would refuse."""
        return engine_plan(spec, self.paths, tuple(self.gpus()), self.environ)

    def plan_text(self) -> str:
        """The dry-run plan of the current spec, or why there is none."""
        if self.spec is None:
            return "No plan: " + (str(self.error or "") or "the form is not complete") + "."
        try:
            return planmod.format_plan(self.launch_plan(self.spec))
        except Exception as e:  # a plan that cannot be made says why, in one line
            return f"No plan: {one_line(e)}"

    def _fill_plan(self) -> None:
        self.plan_view.setPlainText(self.plan_text())

    # -- a Jupyter kernel -------------------------------------------------------------------------

    def kernel_spec(self) -> JobSpec:
        """The form's options and interpreter as a kernel's spec (no script, arguments, folder or
        job name: Jupyter starts the kernel, in the notebook's folder, named after it). Raises
        SpecError."""
        spec = self.form_spec(script_needed=False)
        return replace(
            spec,
            script="",
            args=(),
            cwd=None,
            name=None,
            resume=False,
            fresh=False,
            python=ks.kernel_python(self.python_path()),
        )

    def install_kernel(self) -> None:
        """Install the form's options as a Jupyter kernel spec (in the user's Jupyter folder),
        in the background; the result is one line under the form."""
        if self.installing_kernel:
            return
        try:
            spec = self.kernel_spec()
        except SpecError as e:
            self._kernel_done((False, f"Not installed: {one_line(e)}"))
            return
        gpus = tuple(self.gpus())
        ram_total = self.ram_total()
        process = planmod.JobProcess.from_config(load_config(self.paths.config_file))
        environ = dict(self.environ)
        self.installing_kernel = True
        self.kernel_button.setEnabled(False)
        self.kernel_button.setText("Installing…")
        set_message(self.kernel_label, None)
        self._background.submit(
            lambda: install_kernel_spec(spec, gpus, ram_total, process, environ), self._kernel_done
        )

    def _kernel_done(self, result: Any) -> None:
        self.installing_kernel = False
        self.kernel_button.setEnabled(True)
        self.kernel_button.setText(KERNEL_BUTTON)
        ok, text = result if isinstance(result, tuple) else (False, f"Not installed: {result}")
        self.kernel_label.setStyleSheet("" if ok else ERROR_STYLE)
        set_message(self.kernel_label, one_line(text))

    # -- launching --------------------------------------------------------------------------------

    def launch(self) -> None:
        """Hand the spec to the engine; the dialog closes once the job started, or shows the
        engine's reason."""
        spec = self.revalidate()
        if spec is None or self.launching or not self.status_loaded:
            return
        self.launching = True
        self._update_launch_button()
        self.launch_button.setText("Launching…")
        set_message(self.engine_label, None)
        data = spec.to_json()
        environ = dict(self.environ)
        self._runner.submit(
            lambda c: c.job_start(data, environ=environ),
            lambda job: self._launched(data, job),
            self._launch_failed,
        )

    def _launched(self, data: JSONObject, job: JobRecord) -> None:
        self.launching = False
        self.launch_button.setText("Launch")
        self.recent_store.remember(data)
        self.launched.emit(job)
        self.accept()

    def _launch_failed(self, message: str) -> None:
        self.launching = False
        self.launch_button.setText("Launch")
        text = one_line(message)
        # The engine answers in words; the row is the one its plan of the spec is refused on.
        key = self._plan_refusal_row()
        if key is not None and key in self.row_errors:
            set_message(self.row_errors[key], text)
        set_message(self.engine_label, f"The engine did not start the job: {text}")
        self._update_launch_button()

    def _plan_refusal_row(self) -> Optional[str]:
        """The form row of the SpecError the plan of the current spec is refused with, or None
        (a valid plan, or a refusal about no one field)."""
        if self.spec is None:
            return None
        try:
            self.launch_plan(self.spec)
        except SpecError as e:
            return form_row(e)
        except Exception:  # not about a field: the engine's answer says what
            return None
        return None

    def done(self, result: int) -> None:
        self._revalidate_timer.stop()
        super().done(result)
