"""The launch dialog's form: its rows (each with a one-line explanation and a place for its
problem), grouped in boxes, and the summary, plan and buttons under them. Only widgets and
layout; ``LaunchDialog`` connects them and fills them.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Sequence, Tuple

from PySide6.QtCore import Qt
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QFrame,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from trayapp.jobs import options as opts
from trayapp.jobs import spec_values as sv
from trayapp.jobs.options import JobSpec, MemoryOptions, SpecError
from trayapp.ui.forms import (
    ERROR_STYLE,
    NOTE_STYLE,
    WARNING_STYLE,
    chain_tab_order,
    message_label,
)
from trayapp.ui.launch_rows import RowProblem, one_line_note

AUTO_PYTHON = "__auto__"
# Rows without a line of their own say their problems in this row's line.
PROBLEM_ROW = {
    "args": "script",
    "name": "cwd",
    "checkpoint_every": "checkpoint",
    "resume": "checkpoint",
    "fresh": "checkpoint",
    "auto_resume": "vram_budget",
}

# One line on what each field is or really does, shown under it (a problem replaces it).
EXPLAIN = {
    "script": "The .py file to train; drop one on this window.",
    "cwd": "Where the script runs (its folder when empty).",
    "python": "The interpreter the script runs in; it needs TensorFlow.",
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
    "on_oom": "Out of memory in fit(): train half-size batches, the same training (Keras 3).",
    "fit_batch": "Measures a few small steps first (undone); the same training (Keras 3).",
    "checkpoint": "Progress is saved here, so a parked job continues.",
    "env": "KEY=VALUE a line; variables TensorFlow ignores are flagged.",
}


KERNEL_BUTTON = "&Install as a Jupyter kernel"  # Alt+I


def combo(items: Sequence[Tuple[str, Any]], name: str) -> QComboBox:
    box = QComboBox()
    # A long choice does not widen its column (the form's two columns share the width).
    box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    box.setMinimumContentsLength(16)
    for text, data in items:
        box.addItem(text, data)
    box.setAccessibleName(name)
    return box


def select(box: QComboBox, data: Any) -> None:
    i = box.findData(data)
    box.setCurrentIndex(i if i >= 0 else 0)


class LaunchForm(QDialog):
    """The launch dialog's widgets: ``row_errors`` and ``row_widgets`` by row key."""

    row_errors: Dict[str, QLabel]
    row_widgets: Dict[str, QWidget]

    def _row(
        self,
        form: QFormLayout,
        label: str,
        key: str,
        widget: QWidget,
        explain: Optional[str] = None,
        extra: Optional[QWidget] = None,
    ) -> QWidget:
        holder = QWidget()
        column = QVBoxLayout(holder)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(1)
        line = QHBoxLayout()
        if isinstance(widget, (QComboBox, QLineEdit, QSpinBox)):
            # Marked in red (a style sheet), it keeps its height: the rows under it stay.
            widget.setMinimumHeight(widget.sizeHint().height())
        line.addWidget(widget, 1)
        if extra is not None:
            line.addWidget(extra)
        column.addLayout(line)
        explain = explain or EXPLAIN.get(key)
        if key in PROBLEM_ROW:
            error = self.row_errors[PROBLEM_ROW[key]]
        else:
            # The explanation and the problem share one line (a row without an explanation
            # keeps an empty one): nothing under the row moves when a problem is said.
            note = one_line_note(explain or "")
            error = RowProblem(note)
            error.setAccessibleName(f"{label or key}: problem")
            cell = QGridLayout()
            cell.setContentsMargins(0, 0, 0, 0)
            cell.addWidget(note, 0, 0)
            cell.addWidget(error, 0, 0)
            column.addLayout(cell)
        widget.setAccessibleName(label)
        if explain:
            widget.setAccessibleDescription(explain)
            widget.setToolTip(explain)
        form.addRow(label, holder)
        self.row_errors[key] = error
        self.row_widgets[key] = widget
        return holder

    def _build(self, recent: Sequence[str]) -> None:
        """The form's widgets and layout (``recent``: the scripts for the script's list); the
        dialog connects them."""
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
        left.addWidget(self._script_box(recent))
        left.addWidget(self._interpreter_box())
        left.addWidget(self._gpu_box())
        right.addWidget(self._memory_box())
        right.addWidget(self._guard_box())
        right.addWidget(self._env_box())
        right.addStretch(1)
        left.addWidget(self._checkpoint_box())
        left.addStretch(1)
        self._footer(outer)

    def _script_box(self, recent: Sequence[str]) -> QGroupBox:
        """The script: its path (recent ones listed), arguments, folder and name."""
        box = QGroupBox("Script")
        form = QFormLayout(box)
        self.script_combo = QComboBox()
        self.script_combo.setEditable(True)
        self.script_combo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        script_edit = self.script_combo.lineEdit()
        assert script_edit is not None  # an editable combo has one
        script_edit.setPlaceholderText("a training script (.py); drop one here")
        for path in recent:
            self.script_combo.addItem(path, path)
        self.script_combo.setCurrentIndex(-1)
        self.script_combo.setEditText("")
        self.script_browse = QPushButton("Browse…")
        self.script_browse.setAccessibleName("Choose the script")
        self._row(form, "Script", "script", self.script_combo, extra=self.script_browse)
        self.args_edit = QLineEdit()
        self.args_edit.setPlaceholderText("the script's own arguments, e.g. --epochs 10")
        self._row(form, "Arguments", "args", self.args_edit)
        self.cwd_edit = QLineEdit()
        self.cwd_edit.setPlaceholderText("the script's folder")
        self.cwd_browse = QPushButton("Browse…")
        self.cwd_browse.setAccessibleName("Choose the working folder")
        self._row(form, "Working folder", "cwd", self.cwd_edit, extra=self.cwd_browse)
        self.name_edit = QLineEdit()
        self.name_edit.setPlaceholderText("the script's name")
        self._row(form, "Job name", "name", self.name_edit)
        return box

    def _interpreter_box(self) -> QGroupBox:
        """The interpreter: the choice, what it has, what is wrong with it."""
        box = QGroupBox("Interpreter")
        form = QFormLayout(box)
        self.python_combo = QComboBox()
        self.python_combo.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.python_combo.setMinimumContentsLength(30)
        self.python_browse = QPushButton("Browse…")
        self.python_browse.setAccessibleName("Choose another interpreter")
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
        # Neither what is probed nor an interpreter's long path may widen the column.
        self.probe_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        busy.addWidget(self.probe_bar)
        busy.addWidget(self.probe_label, 1)
        self.busy_row = QWidget()
        self.busy_row.setLayout(busy)
        busy.setContentsMargins(0, 0, 0, 0)
        self.python_info = QLabel("Choose a script to find its interpreters.")
        self.python_info.setWordWrap(True)
        self.python_info.setAccessibleName("What the interpreter has")
        self.python_info.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        line = self.python_info.fontMetrics().lineSpacing()
        self.python_info.setWordWrap(False)  # one line; the whole of it: its tooltip
        self.python_info.setFixedHeight(line + 4)
        self.python_info.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        form.addRow("Has", self.python_info)
        self.doctor_label = message_label(WARNING_STYLE, "Interpreter problems")
        self.doctor_label.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.doctor_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Ignored)
        # The probe's progress, then what the doctor says, in room kept for them: the rows
        # under them stay where they are when a probe ends (the whole text: the tooltip).
        status = QWidget()
        status.setFixedHeight(3 * line + 6)
        column = QVBoxLayout(status)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(2)
        column.addWidget(self.busy_row)
        column.addWidget(self.doctor_label, 1)
        column.addStretch(0)
        self.busy_row.hide()
        form.addRow("", status)
        return box

    def _gpu_box(self) -> QGroupBox:
        """The GPUs the job may use."""
        box = QGroupBox("GPU")
        form = QFormLayout(box)
        self.gpu_combo = combo([("Reading the GPUs from the engine…", "all")], "GPU")
        self._row(form, "Use", "gpu", self.gpu_combo, EXPLAIN["gpu"])
        return box

    def _env_box(self) -> QGroupBox:
        """The job's environment variables."""
        box = QGroupBox("Environment")
        form = QFormLayout(box)
        self.env_edit = QPlainTextEdit()
        self.env_edit.setPlaceholderText("KEY=VALUE")
        self.env_edit.setTabChangesFocus(True)
        self.env_edit.setFixedHeight(54)
        self._row(form, "Variables", "env", self.env_edit, EXPLAIN["env"])
        self.env_warning = message_label(WARNING_STYLE, "Environment warnings")
        form.addRow("", self.env_warning)
        return box

    def _memory_box(self) -> QGroupBox:
        """The memory options: the preset and the TensorFlow knobs it fills."""
        box = QGroupBox("Memory options")
        form = QFormLayout(box)
        self.preset_combo = combo(
            [("Custom", None)] + [(name, name) for name in opts.PRESETS], "Preset"
        )
        for i, name in enumerate(opts.PRESETS, start=1):
            self.preset_combo.setItemData(i, opts.PRESETS[name], Qt.ItemDataRole.ToolTipRole)
        self._row(form, "Preset", "preset", self.preset_combo, EXPLAIN["preset"])
        self.growth_combo = combo(
            [("TensorFlow's default (off)", None), ("On", True), ("Off", False)], "Memory growth"
        )
        self._row(form, "Memory growth", "growth", self.growth_combo, EXPLAIN["growth"])
        self.vram_mode = combo(
            [("No cap", "none"), ("Use at most", "limit"), ("Leave free", "reserve")], "VRAM cap"
        )
        self.vram_spin = QSpinBox()
        self.vram_spin.setRange(1, 10_000_000)
        self.vram_spin.setSingleStep(256)
        self.vram_spin.setSuffix(" MiB")
        self.vram_spin.setValue(4096)
        self.vram_spin.setAccessibleName("VRAM cap in MiB")
        self._row(form, "GPU memory", "vram", self.vram_mode, EXPLAIN["vram"], extra=self.vram_spin)
        self.allocator_combo = combo(
            [("TensorFlow's default (BFC)", None)]
            + [(a, a) for a in opts.ALLOCATORS if a != "bfc"],
            "Allocator",
        )
        self._row(form, "Allocator", "allocator", self.allocator_combo, EXPLAIN["allocator"])
        self.precision_combo = combo(
            [("float32 (default)", None)] + [(p, p) for p in opts.PRECISIONS if p != "float32"],
            "Precision",
        )
        self._row(form, "Precision", "precision", self.precision_combo, EXPLAIN["precision"])
        self.xla_combo = combo(
            [("TensorFlow's default", None), ("On", True), ("Off", False)], "XLA"
        )
        self._row(form, "XLA", "xla", self.xla_combo, EXPLAIN["xla"])
        self.intra_spin = QSpinBox()
        self.inter_spin = QSpinBox()
        for spin, what in ((self.intra_spin, "intra-op"), (self.inter_spin, "inter-op")):
            spin.setRange(0, 1024)
            spin.setSpecialValueText(f"{what}: auto")
            spin.setPrefix(f"{what}: ")
            spin.setAccessibleName(f"{what} threads")
        self._row(
            form,
            "CPU threads",
            "threads",
            self.intra_spin,
            EXPLAIN["threads"],
            extra=self.inter_spin,
        )
        return box

    def _guard_box(self) -> QGroupBox:
        """The guard's budgets for the job, and whether it resumes by itself."""
        box = QGroupBox("Guard")
        form = QFormLayout(box)
        self.ram_budget_edit = QLineEdit()
        self.ram_budget_edit.setPlaceholderText("none; e.g. 12 GiB or 12288 MiB")
        self._row(form, "RAM budget", "ram_budget", self.ram_budget_edit, EXPLAIN["ram_budget"])
        self.vram_budget_edit = QLineEdit()
        self.vram_budget_edit.setPlaceholderText("none; e.g. 6 GiB or 6144 MiB")
        self._row(form, "VRAM budget", "vram_budget", self.vram_budget_edit, EXPLAIN["vram_budget"])
        self.manual_resume_box = QCheckBox("After a park, wait for me to resume it")
        self._row(form, "", "auto_resume", self.manual_resume_box)
        self.on_oom_combo = combo(
            [
                ("Shrink the batch", "shrink"),
                ("Shrink, even with Keras 2 (changes the training)", "smaller-batch"),
                ("Stop the job", "stop"),
            ],
            "On out of memory",
        )
        self.min_batch_spin = QSpinBox()
        self.min_batch_spin.setRange(1, 1 << 20)
        self.min_batch_spin.setValue(sv.MIN_BATCH_DEFAULT)
        self.min_batch_spin.setPrefix("down to ")
        self.min_batch_spin.setAccessibleName("Smallest micro-batch")
        self._row(
            form,
            "Out of memory",
            "on_oom",
            self.on_oom_combo,
            EXPLAIN["on_oom"],
            extra=self.min_batch_spin,
        )
        self.fit_batch_box = QCheckBox("Start at the largest micro-batch that fits")
        self.fit_batch_box.setChecked(True)  # as headroom run: on unless --no-fit-batch
        self._row(form, "Fit the batch", "fit_batch", self.fit_batch_box, EXPLAIN["fit_batch"])
        return box

    def _checkpoint_box(self) -> QGroupBox:
        """The checkpoint folder, its interval, resume or start over."""
        box = QGroupBox("Checkpoints")
        form = QFormLayout(box)
        self.ckpt_edit = QLineEdit()
        self.ckpt_edit.setPlaceholderText("none")
        self.ckpt_browse = QPushButton("Browse…")
        self.ckpt_browse.setAccessibleName("Choose the checkpoint folder")
        self._row(
            form,
            "Folder",
            "checkpoint",
            self.ckpt_edit,
            EXPLAIN["checkpoint"],
            extra=self.ckpt_browse,
        )
        self.ckpt_every_spin = QSpinBox()
        self.ckpt_every_spin.setRange(0, 10_000_000)
        self.ckpt_every_spin.setSpecialValueText("every epoch")
        self.ckpt_every_spin.setPrefix("every ")
        self.ckpt_every_spin.setSuffix(" steps")
        self._row(form, "Interval", "checkpoint_every", self.ckpt_every_spin)
        self.resume_box = QCheckBox("Resume from the last checkpoint")
        self._row(form, "", "resume", self.resume_box)
        self.fresh_box = QCheckBox("Start over (the checkpoint there is deleted)")
        self._row(form, "", "fresh", self.fresh_box)
        self.fresh_box.setAccessibleName("Start over: delete the checkpoint in the folder")
        return box

    def _footer(self, outer: QVBoxLayout) -> None:
        """Under the form: what it means, what is wrong, the plan, and the buttons."""
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
        self._buttons(outer)
        self._chain_tabs()
        self.script_combo.setFocus()
        self.resize(1060, 780)

    def _buttons(self, outer: QVBoxLayout) -> None:
        """The buttons at the foot, with the Jupyter kernel's line above them."""
        self.buttons = QDialogButtonBox()
        self.plan_button = QPushButton("Show command")
        self.plan_button.setCheckable(True)
        self.plan_button.setAccessibleName("Show the launch plan")
        self.plan_button.setAutoDefault(False)
        self.launch_button = QPushButton("Launch")
        self.launch_button.setAccessibleName("Launch training")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setAccessibleName("Close without launching")
        self.cancel_button.setAutoDefault(False)
        # The same options as a Jupyter kernel (no script needed): a notebook's kernel as a job.
        self.kernel_button = QPushButton(KERNEL_BUTTON)
        self.kernel_button.setAccessibleName("Install these options as a Jupyter kernel")
        self.kernel_button.setToolTip(
            "Write a Jupyter kernel spec with these memory options and this interpreter (it "
            "needs ipykernel): Jupyter lists it as 'Python 3 (Headroom: preset)', and its "
            "kernel runs under the guard like a launched job"
        )
        self.kernel_button.setAutoDefault(False)
        self.kernel_label = message_label(NOTE_STYLE, "Jupyter kernel")
        outer.addWidget(self.kernel_label)
        self.buttons.addButton(self.kernel_button, QDialogButtonBox.ButtonRole.ActionRole)
        self.buttons.addButton(self.plan_button, QDialogButtonBox.ButtonRole.ActionRole)
        self.buttons.addButton(self.launch_button, QDialogButtonBox.ButtonRole.AcceptRole)
        self.buttons.addButton(self.cancel_button, QDialogButtonBox.ButtonRole.RejectRole)
        outer.addWidget(self.buttons)
        self.launch_button.setDefault(True)  # Enter launches

    def _chain_tabs(self) -> None:
        """Tab goes down the form as it reads, then along the buttons."""
        chain_tab_order(
            [
                self.script_combo,
                self.script_browse,
                self.args_edit,
                self.cwd_edit,
                self.cwd_browse,
                self.name_edit,
                self.python_combo,
                self.python_browse,
                self.gpu_combo,
                self.env_edit,
                self.ckpt_edit,
                self.ckpt_browse,
                self.ckpt_every_spin,
                self.resume_box,
                self.fresh_box,
                self.preset_combo,
                self.growth_combo,
                self.vram_mode,
                self.vram_spin,
                self.allocator_combo,
                self.precision_combo,
                self.xla_combo,
                self.intra_spin,
                self.inter_spin,
                self.ram_budget_edit,
                self.vram_budget_edit,
                self.manual_resume_box,
                self.on_oom_combo,
                self.min_batch_spin,
                self.fit_batch_box,
                self.kernel_button,
                self.plan_button,
                self.launch_button,
                self.cancel_button,
            ]
        )

    # -- what the form says ----------------------------------------------------------------

    def script(self) -> str:
        return self.script_combo.currentText().strip()

    def _gpu_choice(self) -> Tuple[Optional[Tuple[int, ...]], bool]:
        data = self.gpu_combo.currentData()
        if data == "cpu":
            return None, True
        if isinstance(data, int):
            return (data,), False
        return None, False

    def form_spec(self, script_needed: bool = True) -> JobSpec:
        """The spec the form describes. Raises SpecError for a field that cannot be read.
        ``script_needed=False`` (a kernel's options): without a script, one stands in."""
        script = self.script() or ("" if script_needed else "kernel")
        if not script:
            raise SpecError("script: choose a training script", sv.SCRIPT)
        script = os.path.abspath(os.path.expanduser(script))
        gpus, cpu_only = self._gpu_choice()
        mode = self.vram_mode.currentData()
        options = MemoryOptions(
            gpus=gpus,
            cpu_only=cpu_only,
            memory_growth=self.growth_combo.currentData(),
            vram_limit_mb=self.vram_spin.value() if mode == "limit" else None,
            vram_reserve_mb=self.vram_spin.value() if mode == "reserve" else None,
            allocator=self.allocator_combo.currentData(),
            precision=self.precision_combo.currentData(),
            xla=self.xla_combo.currentData(),
            intra_threads=self.intra_spin.value() or None,
            inter_threads=self.inter_spin.value() or None,
        )
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
            ram_budget_mb=sv.parse_mb("--ram-budget", self.ram_budget_edit.text(), sv.RAM_BUDGET),
            vram_budget_mb=sv.parse_mb(
                "--vram-budget", self.vram_budget_edit.text(), sv.VRAM_BUDGET
            ),
            checkpoint_dir=os.path.abspath(os.path.expanduser(ckpt)) if ckpt else None,
            checkpoint_every_steps=self.ckpt_every_spin.value() or None,
            resume=self.resume_box.isChecked(),
            fresh=self.fresh_box.isChecked(),
            preset=self.preset_combo.currentData(),
            auto_resume=False if self.manual_resume_box.isChecked() else None,
            on_oom=str(self.on_oom_combo.currentData()),
            min_batch=None
            if self.min_batch_spin.value() == sv.MIN_BATCH_DEFAULT
            else self.min_batch_spin.value(),
            fit_batch=self.fit_batch_box.isChecked(),
        )
