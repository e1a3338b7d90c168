"""The launch dialog's interpreter: the choice offered for a script (found beside it, on PATH,
in conda or pyenv, or chosen), each probed in the background for its Python, TensorFlow and
Keras, and what the doctor says keeps the chosen one from training here.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set

from PySide6.QtWidgets import QComboBox, QLabel, QWidget

from trayapp.engine.status_record import Status
from trayapp.jobs import doctor, interpreters
from trayapp.jobs.interpreters import Interpreter
from trayapp.ui.background import Background
from trayapp.ui.forms import one_line, set_message
from trayapp.ui.launch_form import AUTO_PYTHON, select

log = logging.getLogger("headroom.ui")

PROBES_AT_ONCE = 2
WHERE = {
    "venv": "venv beside the script",
    "current": "Headroom's own",
    "conda": "conda",
    "pyenv": "pyenv",
    "path": "on PATH",
}


class InterpreterChoice:
    """The interpreter row of the launch dialog (its combo, what the interpreter has, the busy
    row, the doctor's problems). ``on_change()`` runs when the choice or what is known of it
    changes, except while the combo is filled here; ``status()`` is the engine's last status
    (its GPUs, for the doctor)."""

    def __init__(
        self,
        combo: QComboBox,
        info: QLabel,
        busy_row: QWidget,
        busy_label: QLabel,
        doctor_label: QLabel,
        background: Background,
        *,
        cache: Path,
        timeout: float,
        on_change: Callable[[], None],
        status: Callable[[], Status],
    ):
        self.combo, self.info, self.doctor_label = combo, info, doctor_label
        self.busy_row, self.busy_label = busy_row, busy_label
        self._background = background
        self.cache, self.timeout = cache, timeout
        self._on_change, self._status = on_change, status
        self.interpreters: Dict[str, Interpreter] = {}  # path -> its probe
        self.probing: Set[str] = set()
        # Importing TensorFlow in many interpreters at once would swamp the machine.
        self._slots = threading.Semaphore(PROBES_AT_ONCE)
        self._discovery = 0  # which discovery answer is the latest
        self._auto: Optional[str] = None  # what "Automatic" resolves to
        self._filling = False

    def discover(self, script: str) -> None:
        """Find the interpreters for ``script`` in the background, then probe each."""
        self._discovery += 1
        ticket = self._discovery
        self._set_busy("Finding interpreters…")
        self._background.submit(
            lambda: (
                interpreters.discover_with_sources(script),
                interpreters.default_python(script),
            ),
            lambda result: self._discovered(ticket, result),
        )

    def _discovered(self, ticket: int, result: Any) -> None:
        if ticket != self._discovery:
            return
        found, default = ([], None) if isinstance(result, Exception) else result
        wanted = self.combo.currentData()
        self._filling = True
        try:
            combo = self.combo
            combo.clear()
            combo.addItem(f"Automatic: {default}" if default else "Automatic", AUTO_PYTHON)
            for path, source in found:
                combo.addItem(self.label(path, source), path)
            if isinstance(wanted, str) and wanted != AUTO_PYTHON and combo.findData(wanted) < 0:
                combo.addItem(self.label(wanted, "user"), wanted)
            select(combo, wanted if wanted is not None else AUTO_PYTHON)
        finally:
            self._filling = False
        self._auto = default
        paths = [p for p, _ in found]
        if isinstance(wanted, str) and wanted not in (AUTO_PYTHON, *paths):
            paths.append(wanted)
        sources = dict(found)
        self._set_busy(None)
        chosen = self.path()
        if chosen in paths:  # the interpreter shown is probed first
            paths.remove(chosen)
            paths.insert(0, chosen)
        for path in paths:
            self.probe(path, sources.get(path, "user"))
        self.changed()

    def label(self, path: str, source: str) -> str:
        """The combo's line for an interpreter: where it was found, and what it has once
        probed."""
        interp = self.interpreters.get(path)
        text = f"{path} ({WHERE.get(source, 'chosen')})"
        if interp is not None:
            text += f" — {interp.summary()}"
        return text

    def probe(self, path: str, source: str) -> None:
        """Probe ``path`` in the background (once; at most ``PROBES_AT_ONCE`` at a time)."""
        if path in self.interpreters or path in self.probing:
            return
        self.probing.add(path)
        self._set_busy(None)
        cache, timeout, slots = self.cache, self.timeout, self._slots

        def run() -> Any:
            with slots:
                return interpreters.probe(path, cache_dir=cache, timeout=timeout, source=source)

        self._background.submit(run, lambda result: self._probed(path, source, result))

    def _probed(self, path: str, source: str, result: Any) -> None:
        self.probing.discard(path)
        if isinstance(result, Exception):
            result = Interpreter(
                path=path, source=source, error=f"the probe failed: {one_line(result)}"
            )
        self.interpreters[path] = result
        for i in range(self.combo.count()):
            if self.combo.itemData(i) == path:
                self.combo.setItemText(i, self.label(path, source))
        self._set_busy(None)
        if path == self.path():
            self.changed()

    def _set_busy(self, text: Optional[str]) -> None:
        if text is None and self.probing:
            n = len(self.probing)
            text = (
                f"Probing {n} interpreter{'s' if n != 1 else ''} (TensorFlow takes a while "
                "to import)…"
            )
        self.busy_label.setText(text or "")
        self.busy_row.setVisible(bool(text))

    def path(self) -> Optional[str]:
        """The interpreter the job will run in (the automatic choice resolved)."""
        data = self.combo.currentData()
        if data == AUTO_PYTHON or data is None:
            return self._auto
        return str(data)

    def use(self, path: str) -> None:
        """Choose the interpreter at ``path`` (added to the list and probed)."""
        if self.combo.findData(path) < 0:
            self.combo.addItem(self.label(path, "user"), path)
        select(self.combo, path)
        self.probe(path, "user")

    def show_spec_python(self, python: Optional[str]) -> None:
        """Select a spec's interpreter (None: the automatic choice), adding it when new."""
        if python:
            if self.combo.findData(python) < 0:
                self.combo.addItem(self.label(python, "user"), python)
            select(self.combo, python)
        else:
            select(self.combo, AUTO_PYTHON)

    def changed(self) -> None:
        """The choice changed: what it has, the doctor's problems, then ``on_change``."""
        path = self.path()
        interp = self.interpreters.get(path) if path else None
        if path is None:
            self.info.setText("Choose a script to find its interpreters.")
        elif interp is None:
            self.info.setText(f"{path}: probing…" if path in self.probing else path)
        else:
            self.info.setText(interp.summary())
        self.info.setToolTip(self.info.text())
        self.refresh_doctor()
        if not self._filling:
            self._on_change()

    def refresh_doctor(self) -> None:
        path = self.path()
        interp = self.interpreters.get(path) if path else None
        if interp is None:
            set_message(self.doctor_label, None)
            self.doctor_label.setToolTip("")
            return
        text = "\n".join(self.doctor_problems(interp) + self.gpu_warnings(interp))
        set_message(self.doctor_label, text)
        self.doctor_label.setToolTip(text)  # the whole text, should it need more room

    def gpu_warnings(self, interp: Interpreter) -> List[str]:
        """A line when this interpreter's TensorFlow cannot use a GPU (a CPU build, or one
        that sees none) while the engine sees GPUs: the GPU options would do nothing."""
        return [gpu_warning(interp)] if cpu_tensorflow(interp) and self._status().gpus else []

    def chosen(self) -> Optional[Interpreter]:
        """The probe of the chosen interpreter, once it is known."""
        path = self.path()
        return self.interpreters.get(path) if path else None

    def doctor_problems(self, interp: Interpreter) -> List[str]:
        """Lines about what keeps this interpreter from training on this machine: the doctor's
        failed and doubtful checks, with their fixes."""
        status = self._status()
        try:
            checks = doctor.diagnose(interp, status.gpu_status, status.gpus)
        except Exception as e:  # the doctor's trouble must not keep the dialog from working
            log.exception("the interpreter check failed")
            return [f"the interpreter check failed: {one_line(e)}"]
        lines = []
        for check in checks:
            if check.verdict not in ("fail", "warn"):  # the doctor's verdicts
                continue
            mark = "✗" if check.verdict == "fail" else "⚠"
            text = f"{mark} {check.name}: {check.detail}"
            if check.fix:
                text += f" — {check.fix}"
            lines.append(text)
        return lines


def cpu_tensorflow(interp: Optional[Interpreter]) -> bool:
    """Whether the probe says this interpreter's TensorFlow trains on the CPU only (a CPU
    build, or a build that sees no GPU); False while not known."""
    if interp is None or interp.tf_version is None:
        return False
    return interp.is_cuda_build is False or interp.gpus_seen == 0


def gpu_warning(interp: Interpreter) -> str:
    what = "is a CPU build" if interp.is_cuda_build is False else "sees no GPU"
    return (
        f"⚠ This TensorFlow {what}: the job trains on the CPU and the GPU options below "
        "do nothing (a CUDA build uses the GPUs)."
    )
