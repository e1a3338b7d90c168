"""What the launch dialog's code writes into its form: the defaults, a spec's memory options
(a preset's or one remembered for a script) and the GPUs of the engine's status.
"""

from __future__ import annotations

from typing import Optional

from PySide6.QtWidgets import QComboBox

from trayapp.engine.status_record import Status
from trayapp.jobs import spec_values as sv
from trayapp.jobs.options import JobSpec, MemoryOptions
from trayapp.ui.launch_form import AUTO_PYTHON, LaunchForm, select
from trayapp.ui.launch_plan import gpu_choices


def clear_form(form: LaunchForm, keep_script: bool = False) -> None:
    """The form's fields as they are before anything is chosen (the preset aside)."""
    if not keep_script:
        form.script_combo.setEditText("")
    for edit in (
        form.args_edit,
        form.cwd_edit,
        form.name_edit,
        form.ram_budget_edit,
        form.vram_budget_edit,
        form.ckpt_edit,
    ):
        edit.clear()
    form.env_edit.clear()
    form.manual_resume_box.setChecked(False)
    select(form.on_oom_combo, "shrink")
    form.min_batch_spin.setValue(sv.MIN_BATCH_DEFAULT)
    form.fit_batch_box.setChecked(JobSpec.fit_batch)  # on unless turned off
    form.resume_box.setChecked(False)
    form.fresh_box.setChecked(False)
    form.ckpt_every_spin.setValue(0)
    select(form.python_combo, AUTO_PYTHON)


def fill_options(form: LaunchForm, o: MemoryOptions) -> Optional[int]:
    """Show ``o`` in the form. Returns the one GPU ``o`` names when the form does not list it
    yet (the engine's GPUs are not known): it is chosen once they are. None otherwise."""
    wanted = None
    if o.cpu_only:
        select(form.gpu_combo, "cpu")
    elif o.gpus and len(o.gpus) == 1:
        if form.gpu_combo.findData(o.gpus[0]) >= 0:
            select(form.gpu_combo, o.gpus[0])
        else:  # the engine's GPUs are not known yet: chosen once they are
            wanted = o.gpus[0]
    elif form.gpu_combo.currentData() == "cpu":
        select(form.gpu_combo, "all")
    select(form.growth_combo, o.memory_growth)
    if o.vram_limit_mb is not None:
        select(form.vram_mode, "limit")
        form.vram_spin.setValue(o.vram_limit_mb)
    elif o.vram_reserve_mb is not None:
        select(form.vram_mode, "reserve")
        form.vram_spin.setValue(o.vram_reserve_mb)
    else:
        select(form.vram_mode, "none")
    select(form.allocator_combo, None if o.allocator == "bfc" else o.allocator)
    select(form.precision_combo, None if o.precision == "float32" else o.precision)
    select(form.xla_combo, o.xla)
    form.intra_spin.setValue(o.intra_threads or 0)
    form.inter_spin.setValue(o.inter_threads or 0)
    return wanted


def fill_gpus(combo: QComboBox, status: Status, wanted: Optional[int]) -> Optional[int]:
    """The GPU choices of ``status`` in ``combo``, the choice kept where it still is one, or
    ``wanted`` (a remembered GPU) chosen. Returns the GPU still wanted: None once the GPUs are
    known."""
    current = combo.currentData()
    items = gpu_choices(status)
    same = [combo.itemData(i) for i in range(combo.count())] == [d for _, d in items]
    if same:
        for i, (text, _d) in enumerate(items):
            combo.setItemText(i, text)
    else:
        combo.clear()
        for text, data in items:
            combo.addItem(text, data)
        if wanted is not None and combo.findData(wanted) >= 0:
            select(combo, wanted)
        elif current is not None and combo.findData(current) >= 0:
            select(combo, current)
        elif len(status.gpus) == 1:
            select(combo, status.gpus[0].index)
        if status.gpus:
            wanted = None
    return wanted
