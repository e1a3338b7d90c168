"""The launch dialog: a training script, its interpreter, the GPU and the memory options, with a
plain-language summary of what they mean, validated as they change, handed to the engine.

The spec is built and checked by ``trayapp.jobs.options`` (the same rules as ``headroom run``);
the GPUs come from the engine's status, never from a probe here. Interpreters are discovered and
probed on background threads; the last settings used for a script come back when it is chosen
again (``launch-recent.json`` in the state folder).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import shlex
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QFontDatabase, QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from trayapp.config import atomic_write, format_bytes, get_paths
from trayapp.config import load as load_config
from trayapp.engine.client import EngineClient
from trayapp.jobs import options as opts
from trayapp.jobs import plan as planmod
from trayapp.jobs import spec_values as sv
from trayapp.jobs.options import JobSpec, MemoryOptions, SpecError
from trayapp.ui.forms import (
    ERROR_STYLE,
    NOTE_STYLE,
    WARNING_STYLE,
    chain_tab_order,
    message_label,
    one_line,
    set_message,
    window_title,
)
from trayapp.ui.worker import CallRunner

log = logging.getLogger("headroom.ui")

MIB = 1024 * 1024
RECENT_FILE = "launch-recent.json"
RECENT_SCRIPTS = 10
REMEMBERED_SPECS = 50
PROBE_TIMEOUT = 90.0
PROBES_AT_ONCE = 2
AUTO_PYTHON = "__auto__"
INVALID_STYLE = "border: 1px solid #c0392b;"

# One line on what each memory option really does, shown under it.
EXPLAIN = {
    "preset": "A starting point that fills the options below.",
    "gpu": "The GPUs TensorFlow may see (CUDA_VISIBLE_DEVICES).",
    "growth": "Take GPU memory as needed, not nearly all of it at start.",
    "vram": "A hard cap per GPU, or what to leave free for the desktop.",
    "allocator": "cuda_malloc_async fragments less (TF_GPU_ALLOCATOR).",
    "precision": "Keras dtype policy; mixed halves activation memory.",
    "xla": "Compile op clusters with XLA (tf.config.optimizer.set_jit).",
    "threads": "TensorFlow's CPU thread pools; auto lets it choose.",
    "ram_budget": "The guard pauses the job above this much RAM.",
    "vram_budget": "The guard pauses the job above this much GPU memory.",
    "checkpoint": "Progress is saved here, so a parked job continues.",
    "env": "KEY=VALUE a line; variables TensorFlow ignores are flagged.",
}

# The form row of each spec field a SpecError names (SpecError.field).
FORM_ROWS: Dict[str, str] = {
    sv.SCRIPT: "script", sv.ARGS: "args", sv.PYTHON: "python", sv.NAME: "name", sv.CWD: "cwd",
    sv.ENV: "env", sv.GPUS: "gpu", sv.CPU_ONLY: "gpu", sv.MEMORY_GROWTH: "growth",
    sv.VRAM_LIMIT: "vram", sv.VRAM_RESERVE: "vram", sv.ALLOCATOR: "allocator",
    sv.PRECISION: "precision", sv.XLA: "xla", sv.THREADS: "threads",
    "options.inter_threads": "threads", sv.RAM_BUDGET: "ram_budget",
    sv.VRAM_BUDGET: "vram_budget", sv.CHECKPOINT_DIR: "checkpoint",
    sv.CHECKPOINT_EVERY: "checkpoint_every", sv.RESUME: "resume", sv.FRESH: "fresh",
    sv.PRESET: "preset", sv.AUTO_RESUME: "auto_resume",
}


# -- pure helpers -----------------------------------------------------------------------------


def gpu_views(gpus: Sequence[Dict[str, Any]]) -> List[Any]:
    """The engine's GPU dicts as objects with the reading's attribute names (``index``,
    ``memory_total_bytes``, ``display_active``...), for ``options.validate`` and friends."""
    views = []
    for g in gpus or ():
        if isinstance(g, dict) and isinstance(g.get("index"), int):
            d = dict(g)
            d.setdefault("display_active", None)
            d.setdefault("memory_total_bytes", None)
            views.append(SimpleNamespace(**d))
    return views


def gpu_status_view(status: Dict[str, Any]) -> Any:
    """The engine's ``gpu_status`` dict as an object with the reading's attribute names."""
    d = {"backend": "none", "message": None, "driver_version": None,
         "cuda_driver_version": None}
    d.update(status.get("gpu_status") or {})
    return SimpleNamespace(**d)


def form_row(error: SpecError) -> Optional[str]:
    """The form row an error is about (by its ``field``), or None."""
    return FORM_ROWS.get(error.field or "")


def _mib_text(mb: Optional[int]) -> str:
    """A size in MB (MiB) as the budget fields show it; "" for none."""
    return "" if mb is None else f"{mb} MiB"


def _gib(mb: float) -> str:
    return format_bytes(mb * MIB)


def summary_text(spec: JobSpec, gpus: Sequence[Dict[str, Any]],
                 ram_total_bytes: Optional[int] = None) -> str:
    """What the options mean, in plain words, e.g. "TensorFlow may use at most 6.0 GiB of
    GPU 0, leaving 2.0 GiB for the desktop; the guard pauses the job above 12.0 GiB of RAM."."""
    o = spec.options
    parts: List[str] = []
    views = gpu_views(gpus)
    chosen = [] if o.cpu_only else opts.selected_gpus(o, views)
    if o.cpu_only:
        parts.append("TensorFlow runs on the CPU only (it sees no GPU)")
    elif not views:
        parts.append("the engine sees no GPU, so TensorFlow runs on the CPU unless it finds "
                     "one itself")
    else:
        clauses = []
        for g in chosen:
            total_mb = opts.total_mb(g)
            name = f"GPU {g.index}"
            if o.vram_limit_mb is not None:
                text = f"may use at most {_gib(o.vram_limit_mb)} of {name}"
                if total_mb is not None:
                    text += f", leaving {_gib(max(0, total_mb - o.vram_limit_mb))} for the " \
                            "desktop"
            elif o.vram_reserve_mb is not None:
                if total_mb is not None:
                    text = (f"may use at most {_gib(max(0, total_mb - o.vram_reserve_mb))} of "
                            f"{name}, leaving {_gib(o.vram_reserve_mb)} for the desktop")
                else:
                    text = f"leaves {_gib(o.vram_reserve_mb)} of {name} free"
            elif o.memory_growth:
                text = f"takes memory of {name} as it needs it"
                if total_mb is not None:
                    text += f" (up to all {_gib(total_mb)})"
            else:
                text = f"takes nearly all of {name}"
                if total_mb is not None:
                    text += f"'s {_gib(total_mb)}"
                text += " at start, leaving little for the desktop"
            clauses.append(text)
        if clauses:
            parts.append("TensorFlow " + ", and ".join(clauses))
        else:
            wanted = ", ".join(str(i) for i in o.gpus or ())
            parts.append(f"the engine sees no GPU {wanted}")
    extras = []
    if not o.cpu_only and o.allocator == "cuda_malloc_async":
        extras.append("CUDA's asynchronous allocator")
    if o.precision and o.precision != "float32":
        extras.append(f"{o.precision} precision")
    if o.xla is True:
        extras.append("XLA")
    if o.intra_threads or o.inter_threads:
        extras.append(f"{o.intra_threads or 'default'} intra-op and "
                      f"{o.inter_threads or 'default'} inter-op threads")
    if extras:
        parts.append("with " + ", ".join(extras))
    guard = []
    if spec.ram_budget_mb is not None:
        text = f"above {_gib(spec.ram_budget_mb)} of RAM"
        if ram_total_bytes:
            text += f" (of {format_bytes(ram_total_bytes)})"
        guard.append(text)
    if spec.vram_budget_mb is not None and not o.cpu_only:
        guard.append(f"above {_gib(spec.vram_budget_mb)} of GPU memory")
    if guard:
        parts.append("the guard pauses the job " + " or ".join(guard))
    else:
        parts.append("the guard watches the machine's free memory (no budget for this job)")
    first = "; ".join(parts)
    sentences = [first[:1].upper() + first[1:] + "."]
    if spec.checkpoint_dir:
        every = f"every {spec.checkpoint_every_steps} steps" if spec.checkpoint_every_steps \
            else "every epoch"
        text = f"Checkpoints go to {spec.checkpoint_dir} {every}"
        text += "; the job continues from the last one." if spec.resume else \
            "; the job starts over and deletes the one there." if spec.fresh else \
            ", so a parked or stopped job continues where it was."
        sentences.append(text)
    else:
        sentences.append("No checkpoints: parking this job loses its training progress.")
    if spec.auto_resume is False:
        sentences.append("After a park it waits for you to resume it.")
    return " ".join(sentences)


# -- remembering the last settings per script ---------------------------------------------------


class RecentLaunches:
    """The recent scripts and the last spec used for each, in one JSON file. A file that
    cannot be read is treated as empty; one that cannot be written is logged."""

    def __init__(self, path: Path):
        self.path = path

    def _read(self) -> Dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {"recent": [], "specs": {}}
        if not isinstance(data, dict):
            return {"recent": [], "specs": {}}
        recent = [s for s in data.get("recent") or [] if isinstance(s, str)]
        specs = {k: v for k, v in (data.get("specs") or {}).items() if isinstance(v, dict)}
        return {"recent": recent, "specs": specs}

    def recent(self) -> List[str]:
        """Scripts launched lately, newest first."""
        return list(self._read()["recent"])

    def spec_for(self, script: str) -> Optional[Dict[str, Any]]:
        """The spec (``JobSpec.to_json()``) last launched for ``script``, or None."""
        return self._read()["specs"].get(os.path.abspath(script))

    def remember(self, spec: Dict[str, Any]) -> None:
        script = os.path.abspath(str(spec.get("script") or ""))
        data = self._read()
        data["recent"] = [script] + [s for s in data["recent"] if s != script]
        del data["recent"][RECENT_SCRIPTS:]
        specs = data["specs"]
        specs.pop(script, None)
        specs[script] = spec
        while len(specs) > REMEMBERED_SPECS:
            specs.pop(next(iter(specs)))
        try:
            atomic_write(self.path, json.dumps(data, indent=1) + "\n", mode=0o600)
        except OSError as e:
            log.warning("cannot remember the launch settings in %s: %s", self.path, e)


# -- background work that needs no engine --------------------------------------------------------


class Background(QObject):
    """Runs plain functions on daemon threads; ``on_done(result)`` runs on the GUI thread.

    A thread holds nothing of Qt's, not even a reference to this object or to ``on_done`` (which
    refers to its dialog): the last reference to a window dropped on a thread would destroy it
    there, off the GUI thread, which crashes Qt. The thread only puts (ticket, result) in a
    queue, which a timer on the GUI thread empties."""

    POLL_MS = 30

    def __init__(self, parent: Optional[QObject] = None):
        super().__init__(parent)
        self._closed = threading.Event()
        self._results: queue.SimpleQueue[Tuple[int, Any]] = queue.SimpleQueue()
        self._waiting: Dict[int, Callable[[Any], None]] = {}
        self._tickets = itertools.count(1)
        self._timer = QTimer(self)
        self._timer.setInterval(self.POLL_MS)
        self._timer.timeout.connect(self._deliver)

    def submit(self, fn: Callable[[], Any], on_done: Callable[[Any], None]) -> None:
        if self._closed.is_set():
            return
        ticket = next(self._tickets)
        self._waiting[ticket] = on_done
        if not self._timer.isActive():
            self._timer.start()
        threading.Thread(target=_background_work, args=(fn, ticket, self._results, self._closed),
                         name="headroom-launch", daemon=True).start()

    def pending(self) -> int:
        return len(self._waiting)

    def close(self) -> None:
        self._closed.set()
        self._waiting.clear()
        if shiboken_valid(self._timer):
            self._timer.stop()

    def _deliver(self) -> None:
        while True:
            try:
                ticket, result = self._results.get_nowait()
            except queue.Empty:
                break
            on_done = self._waiting.pop(ticket, None)
            if on_done is not None and not self._closed.is_set():
                on_done(result)
        if not self._waiting:
            self._timer.stop()


def _background_work(fn: Callable[[], Any], ticket: int,
                     results: queue.SimpleQueue[Tuple[int, Any]],
                     closed: threading.Event) -> None:
    try:
        result = fn()
    except Exception as e:  # a probe that breaks must not break the dialog
        log.exception("background work failed")
        result = e
    if not closed.is_set():
        results.put((ticket, result))


def shiboken_valid(obj: Any) -> bool:
    """Whether ``obj``'s C++ object still exists (a window's children go with it)."""
    try:
        import shiboken6

        return bool(shiboken6.isValid(obj))
    except ImportError:  # pragma: no cover - shiboken6 ships with PySide6
        return True


# -- the dialog ---------------------------------------------------------------------------------


def _combo(items: Sequence[Tuple[str, Any]], name: str) -> QComboBox:
    box = QComboBox()
    for text, data in items:
        box.addItem(text, data)
    box.setAccessibleName(name)
    return box


def _select(box: QComboBox, data: Any) -> None:
    i = box.findData(data)
    box.setCurrentIndex(i if i >= 0 else 0)


class LaunchDialog(QDialog):
    """``LaunchDialog(client_factory, parent=None)``; ``client_factory()`` returns a new
    EngineClient. ``state_dir`` (default: the state folder) holds the recent launches and the
    interpreter cache.

    ``launched(dict)``: the engine's dict of the job it started.
    """

    launched = Signal(object)

    def __init__(self, client_factory: Callable[[], EngineClient],
                 parent: Optional[QWidget] = None, *, state_dir: Optional[Path] = None,
                 probe_cache: Optional[Path] = None, probe_timeout: float = PROBE_TIMEOUT):
        super().__init__(parent)
        self.setWindowTitle(window_title("Launch training"))
        self.setObjectName("launch")
        self.setAcceptDrops(True)
        self.paths = get_paths()
        self.state_dir = state_dir or self.paths.data_dir
        self.recent_store = RecentLaunches(self.state_dir / RECENT_FILE)
        self.probe_cache = probe_cache or self.state_dir / "cache"
        self.probe_timeout = probe_timeout
        # Importing TensorFlow in many interpreters at once would swamp the machine.
        self._probe_slots = threading.Semaphore(PROBES_AT_ONCE)
        self._runner = CallRunner(client_factory, workers=1, parent=self)
        self._background = Background(self)
        self.destroyed.connect(self._runner.close)
        self.destroyed.connect(self._background.close)
        self.status: Dict[str, Any] = {}
        self.status_loaded = False
        self.interpreters: Dict[str, Any] = {}  # path -> Interpreter (probed)
        self.probing: set = set()
        self.spec: Optional[JobSpec] = None  # the valid spec, or None
        self.warnings: List[str] = []
        self.error: Optional[SpecError] = None
        # The environment the job starts from, sent with the launch and shown by the plan: one
        # for both, so "Show command" is what is launched (the engine's own otherwise).
        self.environ: Dict[str, str] = dict(os.environ)
        self.launching = False
        self._filling = False  # the form is being filled by code, not by the user
        self._script_loaded: Optional[str] = None
        self._discovery = 0  # which discovery answer is the latest
        self._auto_python: Optional[str] = None  # what "Automatic" resolves to
        self._wanted_gpu: Optional[int] = None  # a remembered GPU, until the GPUs are known
        self._shown_before = False
        self.row_errors: Dict[str, QLabel] = {}
        self.row_widgets: Dict[str, QWidget] = {}
        self._build()
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

    def _row(self, form: QFormLayout, label: str, key: str, widget: QWidget,
             explain: Optional[str] = None, extra: Optional[QWidget] = None) -> QWidget:
        holder = QWidget()
        column = QVBoxLayout(holder)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(1)
        line = QHBoxLayout()
        line.addWidget(widget, 1)
        if extra is not None:
            line.addWidget(extra)
        column.addLayout(line)
        if explain:
            note = QLabel(explain)
            note.setStyleSheet(NOTE_STYLE)
            column.addWidget(note)
        error = message_label(accessible_name=f"{label}: problem")
        column.addWidget(error)
        widget.setAccessibleName(label)
        if explain:
            widget.setAccessibleDescription(explain)
            widget.setToolTip(explain)
        form.addRow(label, holder)
        self.row_errors[key] = error
        self.row_widgets[key] = widget
        return holder

    def _build(self) -> None:
        outer = QVBoxLayout(self)
        # The form scrolls on small screens rather than squeezing its rows together.
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        content = QWidget()
        scroll.setWidget(content)
        outer.addWidget(scroll, 1)
        columns = QHBoxLayout(content)
        columns.setContentsMargins(0, 0, 0, 0)
        left = QVBoxLayout()
        right = QVBoxLayout()
        columns.addLayout(left, 1)
        columns.addLayout(right, 1)

        # The script
        box = QGroupBox("Script")
        form = QFormLayout(box)
        self.script_combo = QComboBox()
        self.script_combo.setEditable(True)
        self.script_combo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        script_edit = self.script_combo.lineEdit()
        assert script_edit is not None  # an editable combo has one
        script_edit.setPlaceholderText("a training script (.py); drop one here")
        for path in self.recent_store.recent():
            self.script_combo.addItem(path, path)
        self.script_combo.setCurrentIndex(-1)
        self.script_combo.setEditText("")
        self.script_combo.activated.connect(lambda _i: self.choose_script(
            self.script_combo.currentText()))
        script_edit.editingFinished.connect(
            lambda: self.choose_script(self.script_combo.currentText()))
        self.script_combo.editTextChanged.connect(lambda _t: self._changed())
        self.script_browse = QPushButton("Browse…")
        self.script_browse.setAccessibleName("Choose the script")
        self.script_browse.clicked.connect(self._browse_script)
        self._row(form, "Script", "script", self.script_combo, extra=self.script_browse)
        self.args_edit = QLineEdit()
        self.args_edit.setPlaceholderText("the script's own arguments, e.g. --epochs 10")
        self._row(form, "Arguments", "args", self.args_edit)
        self.cwd_edit = QLineEdit()
        self.cwd_edit.setPlaceholderText("the script's folder")
        self.cwd_browse = QPushButton("Browse…")
        self.cwd_browse.setAccessibleName("Choose the working folder")
        self.cwd_browse.clicked.connect(lambda: self._browse_folder(self.cwd_edit))
        self._row(form, "Working folder", "cwd", self.cwd_edit, extra=self.cwd_browse)
        self.name_edit = QLineEdit()
        self.name_edit.setPlaceholderText("the script's name")
        self._row(form, "Job name", "name", self.name_edit)
        left.addWidget(box)

        # The interpreter
        box = QGroupBox("Interpreter")
        form = QFormLayout(box)
        self.python_combo = QComboBox()
        self.python_combo.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.python_combo.setMinimumContentsLength(30)
        self.python_combo.currentIndexChanged.connect(lambda _i: self._python_changed())
        self.python_browse = QPushButton("Browse…")
        self.python_browse.setAccessibleName("Choose another interpreter")
        self.python_browse.clicked.connect(self._browse_python)
        self._row(form, "Python", "python", self.python_combo, extra=self.python_browse)
        busy = QHBoxLayout()
        self.probe_bar = QProgressBar()
        self.probe_bar.setRange(0, 0)
        self.probe_bar.setMaximumWidth(90)
        self.probe_bar.setMaximumHeight(12)
        self.probe_bar.setTextVisible(False)
        self.probe_bar.setAccessibleName("Probing interpreters")
        self.probe_label = QLabel()
        self.probe_label.setStyleSheet(NOTE_STYLE)
        busy.addWidget(self.probe_bar)
        busy.addWidget(self.probe_label, 1)
        self.busy_row = QWidget()
        self.busy_row.setLayout(busy)
        busy.setContentsMargins(0, 0, 0, 0)
        self.busy_row.hide()
        form.addRow("", self.busy_row)
        self.python_info = QLabel("Choose a script to find its interpreters.")
        self.python_info.setWordWrap(True)
        self.python_info.setAccessibleName("What the interpreter has")
        self.python_info.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        form.addRow("Has", self.python_info)
        self.doctor_label = message_label(WARNING_STYLE, "Interpreter problems")
        form.addRow("", self.doctor_label)
        left.addWidget(box)

        # The GPU
        box = QGroupBox("GPU")
        form = QFormLayout(box)
        self.gpu_combo = _combo([("Reading the GPUs from the engine…", "all")], "GPU")
        self.gpu_combo.currentIndexChanged.connect(lambda _i: self._option_changed())
        self._row(form, "Use", "gpu", self.gpu_combo, EXPLAIN["gpu"])
        left.addWidget(box)

        # Environment
        box = QGroupBox("Environment")
        form = QFormLayout(box)
        self.env_edit = QPlainTextEdit()
        self.env_edit.setPlaceholderText("KEY=VALUE")
        self.env_edit.setTabChangesFocus(True)
        self.env_edit.setFixedHeight(54)
        self.env_edit.textChanged.connect(self._changed)
        self._row(form, "Variables", "env", self.env_edit, EXPLAIN["env"])
        self.env_warning = message_label(WARNING_STYLE, "Environment warnings")
        form.addRow("", self.env_warning)
        left.addWidget(box)

        # Memory options
        box = QGroupBox("Memory options")
        form = QFormLayout(box)
        self.preset_combo = _combo([("Custom", None)] + [(name, name) for name in opts.PRESETS],
                                   "Preset")
        for i, name in enumerate(opts.PRESETS, start=1):
            self.preset_combo.setItemData(i, opts.PRESETS[name], Qt.ItemDataRole.ToolTipRole)
        self.preset_combo.activated.connect(lambda _i: self.apply_preset(
            self.preset_combo.currentData()))
        self._row(form, "Preset", "preset", self.preset_combo, EXPLAIN["preset"])
        self.growth_combo = _combo([("TensorFlow's default (off)", None), ("On", True),
                                    ("Off", False)], "Memory growth")
        self.growth_combo.currentIndexChanged.connect(lambda _i: self._option_changed())
        self._row(form, "Memory growth", "growth", self.growth_combo, EXPLAIN["growth"])
        self.vram_mode = _combo([("No cap", "none"), ("Use at most", "limit"),
                                 ("Leave free", "reserve")], "VRAM cap")
        self.vram_mode.currentIndexChanged.connect(lambda _i: self._option_changed())
        self.vram_spin = QSpinBox()
        self.vram_spin.setRange(1, 10_000_000)
        self.vram_spin.setSingleStep(256)
        self.vram_spin.setSuffix(" MB")
        self.vram_spin.setValue(4096)
        self.vram_spin.setAccessibleName("VRAM cap in MB")
        self.vram_spin.valueChanged.connect(lambda _v: self._option_changed())
        self._row(form, "GPU memory", "vram", self.vram_mode, EXPLAIN["vram"],
                  extra=self.vram_spin)
        self.allocator_combo = _combo([("TensorFlow's default (BFC)", None)]
                                      + [(a, a) for a in opts.ALLOCATORS if a != "bfc"],
                                      "Allocator")
        self.allocator_combo.currentIndexChanged.connect(lambda _i: self._option_changed())
        self._row(form, "Allocator", "allocator", self.allocator_combo, EXPLAIN["allocator"])
        self.precision_combo = _combo([("float32 (default)", None)]
                                      + [(p, p) for p in opts.PRECISIONS if p != "float32"],
                                      "Precision")
        self.precision_combo.currentIndexChanged.connect(lambda _i: self._option_changed())
        self._row(form, "Precision", "precision", self.precision_combo, EXPLAIN["precision"])
        self.xla_combo = _combo([("TensorFlow's default", None), ("On", True), ("Off", False)],
                                "XLA")
        self.xla_combo.currentIndexChanged.connect(lambda _i: self._option_changed())
        self._row(form, "XLA", "xla", self.xla_combo, EXPLAIN["xla"])
        self.intra_spin = QSpinBox()
        self.inter_spin = QSpinBox()
        for spin, what in ((self.intra_spin, "intra-op"), (self.inter_spin, "inter-op")):
            spin.setRange(0, 1024)
            spin.setSpecialValueText(f"{what}: auto")
            spin.setPrefix(f"{what}: ")
            spin.setAccessibleName(f"{what} threads")
            spin.valueChanged.connect(lambda _v: self._option_changed())
        self._row(form, "CPU threads", "threads", self.intra_spin, EXPLAIN["threads"],
                  extra=self.inter_spin)
        right.addWidget(box)

        # The guard
        box = QGroupBox("Guard")
        form = QFormLayout(box)
        self.ram_budget_edit = QLineEdit()
        self.ram_budget_edit.setPlaceholderText("none; e.g. 12 GiB or 12288 MiB")
        self.ram_budget_edit.textChanged.connect(lambda _t: self._changed())
        self._row(form, "RAM budget", "ram_budget", self.ram_budget_edit, EXPLAIN["ram_budget"])
        self.vram_budget_edit = QLineEdit()
        self.vram_budget_edit.setPlaceholderText("none; e.g. 6 GiB or 6144 MiB")
        self.vram_budget_edit.textChanged.connect(lambda _t: self._changed())
        self._row(form, "VRAM budget", "vram_budget", self.vram_budget_edit,
                  EXPLAIN["vram_budget"])
        self.manual_resume_box = QCheckBox("After a park, wait for me to resume it")
        self.manual_resume_box.toggled.connect(lambda _c: self._changed())
        self._row(form, "", "auto_resume", self.manual_resume_box)
        right.addWidget(box)
        right.addStretch(1)

        # Checkpoints
        box = QGroupBox("Checkpoints")
        form = QFormLayout(box)
        self.ckpt_edit = QLineEdit()
        self.ckpt_edit.setPlaceholderText("none")
        self.ckpt_edit.textChanged.connect(lambda _t: self._changed())
        self.ckpt_browse = QPushButton("Browse…")
        self.ckpt_browse.setAccessibleName("Choose the checkpoint folder")
        self.ckpt_browse.clicked.connect(lambda: self._browse_folder(self.ckpt_edit))
        self._row(form, "Folder", "checkpoint", self.ckpt_edit, EXPLAIN["checkpoint"],
                  extra=self.ckpt_browse)
        self.ckpt_every_spin = QSpinBox()
        self.ckpt_every_spin.setRange(0, 10_000_000)
        self.ckpt_every_spin.setSpecialValueText("every epoch")
        self.ckpt_every_spin.setPrefix("every ")
        self.ckpt_every_spin.setSuffix(" steps")
        self.ckpt_every_spin.valueChanged.connect(lambda _v: self._changed())
        self._row(form, "Interval", "checkpoint_every", self.ckpt_every_spin)
        self.resume_box = QCheckBox("Resume from the last checkpoint")
        self.resume_box.toggled.connect(lambda _c: self._changed())
        self._row(form, "", "resume", self.resume_box)
        self.fresh_box = QCheckBox("Start over (the checkpoint there is deleted)")
        self.fresh_box.toggled.connect(lambda _c: self._changed())
        self._row(form, "", "fresh", self.fresh_box)
        self.fresh_box.setAccessibleName("Start over: delete the checkpoint in the folder")
        left.addWidget(box)
        left.addStretch(1)

        # What it means, what is wrong, the plan
        self.summary_label = QLabel()
        self.summary_label.setWordWrap(True)
        self.summary_label.setAccessibleName("Summary")
        self.summary_label.setStyleSheet("font-weight: 600;")
        self.summary_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        outer.addWidget(self.summary_label)
        self.warnings_label = message_label(WARNING_STYLE, "Warnings")
        outer.addWidget(self.warnings_label)
        self.error_label = message_label(ERROR_STYLE, "Problem")
        outer.addWidget(self.error_label)
        self.engine_label = message_label(ERROR_STYLE, "Engine problem")
        outer.addWidget(self.engine_label)
        self.plan_view = QPlainTextEdit()
        self.plan_view.setReadOnly(True)
        self.plan_view.setAccessibleName("Launch plan")
        self.plan_view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.plan_view.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.plan_view.setMinimumHeight(140)
        self.plan_view.hide()
        outer.addWidget(self.plan_view)

        self.buttons = QDialogButtonBox()
        self.plan_button = QPushButton("Show command")
        self.plan_button.setCheckable(True)
        self.plan_button.setAccessibleName("Show the launch plan")
        self.plan_button.setAutoDefault(False)
        self.plan_button.toggled.connect(self.show_plan)
        self.launch_button = QPushButton("Launch")
        self.launch_button.setAccessibleName("Launch training")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setAccessibleName("Close without launching")
        self.cancel_button.setAutoDefault(False)
        self.buttons.addButton(self.plan_button, QDialogButtonBox.ButtonRole.ActionRole)
        self.buttons.addButton(self.launch_button, QDialogButtonBox.ButtonRole.AcceptRole)
        self.buttons.addButton(self.cancel_button, QDialogButtonBox.ButtonRole.RejectRole)
        self.launch_button.clicked.connect(self.launch)
        self.cancel_button.clicked.connect(self.reject)
        outer.addWidget(self.buttons)
        self.launch_button.setDefault(True)  # Enter launches

        chain_tab_order([
            self.script_combo, self.script_browse, self.args_edit, self.cwd_edit,
            self.cwd_browse, self.name_edit, self.python_combo, self.python_browse,
            self.gpu_combo, self.env_edit, self.ckpt_edit, self.ckpt_browse,
            self.ckpt_every_spin, self.resume_box, self.fresh_box, self.preset_combo,
            self.growth_combo,
            self.vram_mode, self.vram_spin, self.allocator_combo, self.precision_combo,
            self.xla_combo, self.intra_spin, self.inter_spin, self.ram_budget_edit,
            self.vram_budget_edit, self.manual_resume_box, self.plan_button, self.launch_button,
            self.cancel_button])
        self.script_combo.setFocus()
        self.resize(1040, 720)

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
                self._runner.submit(lambda c: c.status(), self._got_status,
                                    self._status_failed)
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

    def _got_status(self, status: Dict[str, Any]) -> None:
        self.apply_snapshot(status)

    def _status_failed(self, message: str) -> None:
        self.status_loaded = False
        self.gpu_combo.setItemText(0, "GPUs unknown: the engine is not reachable")
        set_message(self.engine_label, f"The engine is not reachable: {one_line(message)}")
        self._update_launch_button()

    def apply_snapshot(self, status: Dict[str, Any]) -> None:
        """Take the GPUs (with their free memory) and the RAM total from a status dict."""
        first = not self.status_loaded
        self.status = status or {}
        self.status_loaded = True
        self._fill_gpus()
        if first:
            if self.engine_label.text().startswith("The engine is not reachable"):
                set_message(self.engine_label, None)
            # A preset depends on the GPUs (a display GPU gets a reserve, not growth).
            if self.preset_combo.currentData() is not None:
                self.apply_preset(self.preset_combo.currentData())
            self._refresh_doctor()
            self.revalidate()

    def set_reachable(self, reachable: bool, reason: Optional[str] = None) -> None:
        if not reachable:
            set_message(self.engine_label, "The engine is not reachable"
                        + (f": {reason}" if reason else "") + "; launching needs it.")
        elif self.engine_label.text().startswith("The engine is not reachable"):
            set_message(self.engine_label, None)
        self._update_launch_button()

    def gpus(self) -> List[Dict[str, Any]]:
        return [g for g in self.status.get("gpus") or [] if isinstance(g, dict)]

    def ram_total(self) -> Optional[int]:
        return (self.status.get("memory") or {}).get("total_bytes")

    def _fill_gpus(self) -> None:
        combo = self.gpu_combo
        current = combo.currentData()
        items: List[Tuple[str, Any]] = []
        gpus = self.gpus()
        if gpus:
            if len(gpus) > 1:
                items.append((f"All {len(gpus)} GPUs", "all"))
            for g in gpus:
                free, total = g.get("memory_free_bytes"), g.get("memory_total_bytes")
                text = f"GPU {g.get('index')}: {g.get('name') or 'GPU'} — "
                text += f"{format_bytes(free)} free of {format_bytes(total)}" \
                    if total is not None else "memory n/a"
                if g.get("simulated"):
                    text += " (simulated)"
                items.append((text, int(g["index"])))
        else:
            why = (self.status.get("gpu_status") or {}).get("message") or "no NVIDIA GPU found"
            items.append((f"Any GPU TensorFlow finds (the engine sees none: {why})", "all"))
        items.append(("CPU only", "cpu"))
        self._filling = True
        try:
            same = [combo.itemData(i) for i in range(combo.count())] == [d for _, d in items]
            if same:
                for i, (text, _d) in enumerate(items):
                    combo.setItemText(i, text)
            else:
                combo.clear()
                for text, data in items:
                    combo.addItem(text, data)
                if self._wanted_gpu is not None and combo.findData(self._wanted_gpu) >= 0:
                    _select(combo, self._wanted_gpu)
                elif current is not None and combo.findData(current) >= 0:
                    _select(combo, current)
                elif gpus and len(gpus) == 1:
                    _select(combo, int(gpus[0]["index"]))
                if gpus:
                    self._wanted_gpu = None
        finally:
            self._filling = False

    # -- the script -----------------------------------------------------------------------------

    def _browse_script(self) -> None:
        start = os.path.dirname(self.script_combo.currentText()) or str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self, "Choose a training script", start,
                                              "Python scripts (*.py);;All files (*)")
        if path:
            self.choose_script(path)

    def _browse_folder(self, edit: QLineEdit) -> None:
        start = edit.text() or os.path.dirname(self.script_combo.currentText()) or \
            str(Path.home())
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
        self._discover(path)
        self.revalidate()

    def script(self) -> str:
        return self.script_combo.currentText().strip()

    # -- interpreters -----------------------------------------------------------------------------

    def _discover(self, script: str) -> None:
        from trayapp.jobs import interpreters

        self._discovery += 1
        ticket = self._discovery
        self._set_busy("Finding interpreters…")
        self._background.submit(
            lambda: (interpreters.discover_with_sources(script),
                     interpreters.default_python(script)),
            lambda result: self._discovered(ticket, result))

    def _discovered(self, ticket: int, result: Any) -> None:
        if ticket != self._discovery:
            return
        if isinstance(result, Exception):
            found, default = [], None
        else:
            found, default = result
        wanted = self.python_combo.currentData()
        self._filling = True
        try:
            combo = self.python_combo
            combo.clear()
            label = f"Automatic: {default}" if default else "Automatic"
            combo.addItem(label, AUTO_PYTHON)
            for path, source in found:
                combo.addItem(self._python_label(path, source), path)
            if isinstance(wanted, str) and wanted != AUTO_PYTHON and combo.findData(wanted) < 0:
                combo.addItem(self._python_label(wanted, "user"), wanted)
            _select(combo, wanted if wanted is not None else AUTO_PYTHON)
        finally:
            self._filling = False
        self._auto_python = default
        paths = [p for p, _ in found]
        if isinstance(wanted, str) and wanted not in (AUTO_PYTHON, *paths):
            paths.append(wanted)
        sources = dict(found)
        self._set_busy(None)
        chosen = self.python_path()
        if chosen in paths:  # the interpreter shown is probed first
            paths.remove(chosen)
            paths.insert(0, chosen)
        for path in paths:
            self._probe(path, sources.get(path, "user"))
        self._python_changed()

    def _python_label(self, path: str, source: str) -> str:
        interp = self.interpreters.get(path)
        where = {"venv": "venv beside the script", "current": "Headroom's own",
                 "conda": "conda", "pyenv": "pyenv", "path": "on PATH"}.get(source, "chosen")
        text = f"{path} ({where})"
        if interp is not None:
            text += f" — {interp.summary()}"
        return text

    def _probe(self, path: str, source: str) -> None:
        from trayapp.jobs import interpreters

        if path in self.interpreters or path in self.probing:
            return
        self.probing.add(path)
        self._set_busy(None)
        cache = self.probe_cache
        timeout = self.probe_timeout
        slots = self._probe_slots

        def run() -> Any:
            with slots:
                return interpreters.probe(path, cache_dir=cache, timeout=timeout, source=source)

        self._background.submit(run, lambda result: self._probed(path, source, result))

    def _probed(self, path: str, source: str, result: Any) -> None:
        from trayapp.jobs.interpreters import Interpreter

        self.probing.discard(path)
        if isinstance(result, Exception):
            result = Interpreter(path=path, source=source,
                                 error=f"the probe failed: {one_line(result)}")
        self.interpreters[path] = result
        combo = self.python_combo
        for i in range(combo.count()):
            if combo.itemData(i) == path:
                combo.setItemText(i, self._python_label(path, source))
        self._set_busy(None)
        if path == self.python_path():
            self._python_changed()

    def _set_busy(self, text: Optional[str]) -> None:
        if text is None and self.probing:
            n = len(self.probing)
            text = f"Probing {n} interpreter{'s' if n != 1 else ''} (TensorFlow takes a while " \
                   "to import)…"
        self.probe_label.setText(text or "")
        self.busy_row.setVisible(bool(text))

    def python_path(self) -> Optional[str]:
        """The interpreter the job will run in (the automatic choice resolved)."""
        data = self.python_combo.currentData()
        if data == AUTO_PYTHON or data is None:
            return self._auto_python
        return str(data)

    def _browse_python(self) -> None:
        start = os.path.dirname(self.python_path() or "") or str(Path.home())
        flt = "Python (python*.exe);;All files (*)" if sys.platform == "win32" else "All files (*)"
        path, _ = QFileDialog.getOpenFileName(self, "Choose a Python interpreter", start, flt)
        if path:
            self.use_python(path)

    def use_python(self, path: str) -> None:
        """Choose the interpreter at ``path`` (added to the list and probed)."""
        combo = self.python_combo
        if combo.findData(path) < 0:
            combo.addItem(self._python_label(path, "user"), path)
        _select(combo, path)
        self._probe(path, "user")

    def _python_changed(self) -> None:
        path = self.python_path()
        interp = self.interpreters.get(path) if path else None
        if path is None:
            self.python_info.setText("Choose a script to find its interpreters.")
        elif interp is None:
            self.python_info.setText(f"{path}: probing…" if path in self.probing else path)
        else:
            self.python_info.setText(interp.summary())
        self._refresh_doctor()
        self._changed()

    def _refresh_doctor(self) -> None:
        path = self.python_path()
        interp = self.interpreters.get(path) if path else None
        if interp is None:
            set_message(self.doctor_label, None)
            return
        set_message(self.doctor_label, "\n".join(self.doctor_problems(interp)))

    def doctor_problems(self, interp: Any) -> List[str]:
        """Lines about what keeps this interpreter from training on this machine: the doctor's
        failed and doubtful checks, with their fixes."""
        from trayapp.jobs import doctor

        try:
            checks = doctor.diagnose(interp, gpu_status_view(self.status), gpu_views(self.gpus()))
        except Exception as e:  # the doctor's trouble must not keep the dialog from working
            log.exception("the interpreter check failed")
            return [f"the interpreter check failed: {one_line(e)}"]
        lines = []
        for check in checks:
            if check.verdict not in ("fail", "warn"):
                continue
            mark = "✗" if check.verdict == "fail" else "⚠"
            text = f"{mark} {check.name}: {check.detail}"
            if check.fix:
                text += f" — {check.fix}"
            lines.append(text)
        return lines

    # -- presets and the form ---------------------------------------------------------------------

    def reset_options(self, keep_script: bool = False) -> None:
        """The form's defaults: the desktop-safe preset, no checkpoints, no variables."""
        self._filling = True
        try:
            if not keep_script:
                self.script_combo.setEditText("")
            for edit in (self.args_edit, self.cwd_edit, self.name_edit, self.ram_budget_edit,
                         self.vram_budget_edit, self.ckpt_edit):
                edit.clear()
            self.env_edit.clear()
            self.manual_resume_box.setChecked(False)
            self.resume_box.setChecked(False)
            self.fresh_box.setChecked(False)
            self.ckpt_every_spin.setValue(0)
            _select(self.python_combo, AUTO_PYTHON)
        finally:
            self._filling = False
        self.apply_preset("desktop-safe")

    def apply_preset(self, name: Optional[str]) -> None:
        """Fill the memory options (and the RAM budget) from preset ``name``; None keeps the
        form as it is, as "Custom"."""
        self._filling = True
        try:
            _select(self.preset_combo, name)
            if name is None:
                return
            try:
                budget = sv.parse_mb("--ram-budget", self.ram_budget_edit.text(), sv.RAM_BUDGET)
            except SpecError:
                budget = None
            # Presets fill only what is unset: a RAM budget already given stays.
            base = JobSpec(script=self.script() or "script.py", ram_budget_mb=budget,
                           options=MemoryOptions(gpus=None if name == "cpu-only"
                                                 else self._gpu_choice()[0]))
            try:
                result = opts.apply_preset(base, name, gpu_views(self.gpus()), self.ram_total())
            except SpecError as e:
                set_message(self.row_errors["preset"], one_line(e))
                return
            self._fill_options(result.options)
            self.ram_budget_edit.setText(_mib_text(result.ram_budget_mb))
        finally:
            self._filling = False
        self._changed()

    def _gpu_choice(self) -> Tuple[Optional[Tuple[int, ...]], bool]:
        data = self.gpu_combo.currentData()
        if data == "cpu":
            return None, True
        if isinstance(data, int):
            return (data,), False
        return None, False

    def _fill_options(self, o: MemoryOptions) -> None:
        self._wanted_gpu = None
        if o.cpu_only:
            _select(self.gpu_combo, "cpu")
        elif o.gpus and len(o.gpus) == 1:
            if self.gpu_combo.findData(o.gpus[0]) >= 0:
                _select(self.gpu_combo, o.gpus[0])
            else:  # the engine's GPUs are not known yet: chosen once they are
                self._wanted_gpu = o.gpus[0]
        elif self.gpu_combo.currentData() == "cpu":
            _select(self.gpu_combo, "all")
        _select(self.growth_combo, o.memory_growth)
        if o.vram_limit_mb is not None:
            _select(self.vram_mode, "limit")
            self.vram_spin.setValue(o.vram_limit_mb)
        elif o.vram_reserve_mb is not None:
            _select(self.vram_mode, "reserve")
            self.vram_spin.setValue(o.vram_reserve_mb)
        else:
            _select(self.vram_mode, "none")
        _select(self.allocator_combo, None if o.allocator == "bfc" else o.allocator)
        _select(self.precision_combo, None if o.precision == "float32" else o.precision)
        _select(self.xla_combo, o.xla)
        self.intra_spin.setValue(o.intra_threads or 0)
        self.inter_spin.setValue(o.inter_threads or 0)

    def fill_from_spec(self, spec: JobSpec) -> None:
        """Show ``spec`` in the form (the settings remembered for a script)."""
        self._filling = True
        try:
            self.script_combo.setEditText(spec.script)
            self.args_edit.setText(shlex.join(spec.args))
            script_dir = os.path.dirname(os.path.abspath(spec.script))
            self.cwd_edit.setText("" if not spec.cwd or spec.cwd == script_dir else spec.cwd)
            self.name_edit.setText(spec.name or "")
            if spec.python:
                if self.python_combo.findData(spec.python) < 0:
                    self.python_combo.addItem(self._python_label(spec.python, "user"),
                                              spec.python)
                _select(self.python_combo, spec.python)
            else:
                _select(self.python_combo, AUTO_PYTHON)
            self.env_edit.setPlainText("\n".join(f"{k}={v}" for k, v in spec.env))
            self._fill_options(spec.options)
            _select(self.preset_combo, spec.preset)
            self.ram_budget_edit.setText(_mib_text(spec.ram_budget_mb))
            self.vram_budget_edit.setText(_mib_text(spec.vram_budget_mb))
            self.manual_resume_box.setChecked(spec.auto_resume is False)
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
            _select(self.preset_combo, None)
        self.vram_spin.setEnabled(self.vram_mode.currentData() != "none")
        self._changed()

    def _changed(self) -> None:
        if not self._filling:
            self._revalidate_timer.start()

    # -- the spec ---------------------------------------------------------------------------------

    def form_spec(self) -> JobSpec:
        """The spec the form describes. Raises SpecError for a field that cannot be read."""
        script = self.script()
        if not script:
            raise SpecError("script: choose a training script", sv.SCRIPT)
        script = os.path.abspath(os.path.expanduser(script))
        gpus, cpu_only = self._gpu_choice()
        mode = self.vram_mode.currentData()
        options = MemoryOptions(
            gpus=gpus, cpu_only=cpu_only,
            memory_growth=self.growth_combo.currentData(),
            vram_limit_mb=self.vram_spin.value() if mode == "limit" else None,
            vram_reserve_mb=self.vram_spin.value() if mode == "reserve" else None,
            allocator=self.allocator_combo.currentData(),
            precision=self.precision_combo.currentData(),
            xla=self.xla_combo.currentData(),
            intra_threads=self.intra_spin.value() or None,
            inter_threads=self.inter_spin.value() or None)
        cwd = self.cwd_edit.text().strip()
        ckpt = self.ckpt_edit.text().strip()
        python = self.python_combo.currentData()
        return JobSpec(
            script=script,
            args=sv.split_args(self.args_edit.text()),
            python=None if python in (None, AUTO_PYTHON) else str(python),
            name=self.name_edit.text().strip() or None,
            cwd=os.path.abspath(os.path.expanduser(cwd)) if cwd else os.path.dirname(script),
            env=sv.parse_env_lines(self.env_edit.toPlainText()),
            options=options,
            ram_budget_mb=sv.parse_mb("--ram-budget", self.ram_budget_edit.text(),
                                      sv.RAM_BUDGET),
            vram_budget_mb=sv.parse_mb("--vram-budget", self.vram_budget_edit.text(),
                                       sv.VRAM_BUDGET),
            checkpoint_dir=os.path.abspath(os.path.expanduser(ckpt)) if ckpt else None,
            checkpoint_every_steps=self.ckpt_every_spin.value() or None,
            resume=self.resume_box.isChecked(),
            fresh=self.fresh_box.isChecked(),
            preset=self.preset_combo.currentData(),
            auto_resume=False if self.manual_resume_box.isChecked() else None)

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
            warnings = opts.validate(spec, gpu_views(self.gpus()), check_paths=True)
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
        env_lines = [w for w in self.warnings if "--env" in w or w.startswith(
            "TensorFlow does not read")]
        other = [w for w in self.warnings if w not in env_lines]
        set_message(self.env_warning, "\n".join(f"⚠ {w}" for w in env_lines))
        set_message(self.warnings_label, "\n".join(f"⚠ {w}" for w in other))
        if self.spec is not None:
            self.summary_label.setText(summary_text(self.spec, self.gpus(), self.ram_total()))
        elif not self.script():
            self.summary_label.setText("Choose a training script to launch (Browse…, a recent "
                                       "one, or drop a .py file here).")
        else:
            self.summary_label.setText("Fix the field marked in red to launch.")
        unplaced = self.error is not None and form_row(self.error) not in self.row_errors
        set_message(self.error_label, str(self.error) if unplaced else None)
        if self.plan_view.isVisible():
            self._fill_plan()
        self._update_launch_button()

    def _update_launch_button(self) -> None:
        self.launch_button.setEnabled(self.spec is not None and not self.launching
                                      and self.status_loaded)

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
        # The job's id is only known once the engine starts it: "new" stands in for it.
        # The priority and log cap: from the settings file the engine reads.
        process = planmod.JobProcess.from_config(load_config(self.paths.config_file))
        return planmod.build_launch(
            spec, job_id="new", address=self.paths.job_address("new"),
            keyfile=str(self.paths.jobs_dir / "new" / "key"),
            gpus=tuple(gpu_views(self.gpus())), base_env=self.environ,
            process=process, log_path=str(self.paths.jobs_dir / "new" / "log"))

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
        self._runner.submit(lambda c: c.job_start(data, environ=environ),
                            lambda job: self._launched(data, job), self._launch_failed)

    def _launched(self, data: Dict[str, Any], job: Dict[str, Any]) -> None:
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

