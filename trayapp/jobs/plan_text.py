"""What a launch plan says in words (``headroom run --dry-run``, the launch dialog): the
runner's steps inside TensorFlow, what an out-of-memory error does, and what the guard does
with the job. Pure: text from a spec and its options.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Tuple

from trayapp.formats import format_bytes
from trayapp.jobs import spec_values as sv
from trayapp.jobs.jobspec import JobSpec
from trayapp.runner import protocol


def runner_steps(options: Mapping[str, Any]) -> List[Tuple[str, str]]:
    """(what, TensorFlow/Keras call) for each thing the runner does inside the job."""
    out: List[Tuple[str, str]] = []
    growth = options.get("memory_growth")
    if growth is not None:
        out.append(
            (
                f"memory growth {'on' if growth else 'off'} for every visible GPU",
                f"tf.config.experimental.set_memory_growth(gpu, {growth})",
            )
        )
    limit = options.get("vram_limit_mb")
    if isinstance(limit, list):
        for i, mb in enumerate(limit):
            out.append(
                (
                    f"GPU:{i} capped at {mb} MiB ({options.get('vram_option')})",
                    f"tf.config.set_logical_device_configuration(gpu, "
                    f"[LogicalDeviceConfiguration(memory_limit={mb})])",
                )
            )
    elif limit is not None:
        out.append(
            (
                f"every visible GPU capped at {limit} MiB",
                f"tf.config.set_logical_device_configuration(gpu, "
                f"[LogicalDeviceConfiguration(memory_limit={limit})])",
            )
        )
    precision = options.get("precision")
    if precision is not None:
        out.append(
            (f"Keras dtype policy {precision}", f"keras.config.set_dtype_policy({precision!r})")
        )
    xla = options.get("xla")
    if xla is not None:
        out.append(
            (
                f"XLA auto-clustering {'on' if xla else 'off'}",
                "tf.config.optimizer.set_jit(%s)" % ("'autoclustering'" if xla else "False"),
            )
        )
    for key, setter in (
        ("intra_threads", "set_intra_op_parallelism_threads"),
        ("inter_threads", "set_inter_op_parallelism_threads"),
    ):
        if options.get(key) is not None:
            out.append(
                (
                    f"{key.replace('_', '-op ')} {options[key]}",
                    f"tf.config.threading.{setter}({options[key]})",
                )
            )
    if options.get("checkpoint_dir"):
        every = options.get("checkpoint_every_steps")
        out.append(
            (
                "checkpoints " + (f"every {every} steps" if every else "every epoch"),
                f"BackupAndRestore files in {options['checkpoint_dir']}/fit-N"
                + (" (resumed)" if options.get("resume") else " (started fresh)"),
            )
        )
    return out


def oom_line(options: Mapping[str, Any]) -> str:
    """What the runner does on an out-of-memory error in fit()."""
    if options.get("on_oom") in sv.ON_OOM_SHRINKS:
        keras2 = (
            "; with Keras 2, batches of half the size (this changes the training)"
            if options.get("on_oom") == sv.ON_OOM_SMALLER_BATCH
            else ""
        )
        return (
            f"shrink: micro-batches of half the batch, twice the gradient accumulation "
            f"(the same training, Keras 3){keras2}, down to {options.get('min_batch')}"
        )
    return "stop: the job fails, as without Headroom"


def fit_batch_line(options: Mapping[str, Any]) -> Optional[str]:
    """What ``--fit-batch`` does before training, or None without it."""
    if not options.get("fit_batch"):
        return None
    return (
        "fit batch: two steps at a sixteenth of the batch measure the memory a step needs "
        "(the weights put back after); training starts at the largest micro-batch forecast "
        "to fit what is free and the budgets (the same training, Keras 3)"
    )


_MODES = {
    "act": "acts (warns, pauses, parks, stops)",
    "dry-run": "records what it would do and does nothing (mode dry-run)",
    "off": "only watches (mode off)",
}


def guard_lines(spec: JobSpec, settings: Mapping[str, Any]) -> List[str]:
    """What the guard will do with the job of ``spec`` (its preset applied), under the settings
    ``settings`` (``config.values``: ``settings["guard.mode"]``...): the budgets, the machine's
    thresholds, the pause, park and stop, and whether it resumes by itself."""
    mode = str(settings["guard.mode"])
    lines = [f"mode: {_MODES.get(mode, mode)}"]
    warn = float(settings["guard.budget_warn_percent"])
    for flag, name, budget in (
        ("--ram-budget", "RAM", spec.ram_budget_mb),
        ("--vram-budget", "VRAM", spec.vram_budget_mb),
    ):
        if budget is None:
            lines.append(
                f"{name} budget: none ({flag}); the job is paused only when the machine runs short"
            )
        else:
            size = format_bytes(budget * sv.MIB)
            lines.append(
                f"{name} budget: {size} ({flag}): a warning at {warn:g}% "
                f"({format_bytes(budget * sv.MIB * warn / 100)}), a pause at {size}"
            )
    lines.append(
        f"the machine's memory: a warning below {settings['guard.warn_available']} available, "
        f"a pause below {settings['guard.pause_available']}, a park below "
        f"{settings['guard.park_available']}, a stop below {settings['guard.stop_available']}"
    )
    lines.append(
        f"pause: at the next batch end; its processes are suspended if it has not "
        f"paused {float(settings['guard.pause_deadline_seconds']):g} s later"
    )
    if spec.checkpoint_dir:
        lines.append(
            f"park: a checkpoint in {spec.checkpoint_dir}, then the job ends (exit "
            f"status {protocol.PARK_EXIT_CODE}) and waits to be resumed"
        )
        lines.append(
            "stop: a checkpoint, then the job ends without the rest of its script "
            f"(exit status {protocol.STOP_EXIT_CODE}); 'headroom resume' continues it"
        )
    else:
        lines.append(
            "park: not for this job (no --checkpoint-dir: parking would lose its "
            "progress); it stays paused instead"
        )
        lines.append(
            "stop: the job ends without the rest of its script (exit status "
            f"{protocol.STOP_EXIT_CODE}), then by force if it goes on"
        )
    auto = spec.auto_resume if spec.auto_resume is not None else bool(settings["guard.auto_resume"])
    if auto:
        lines.append(
            f"resume: by itself, once more than {settings['guard.resume_available']} "
            f"is available for {float(settings['guard.resume_after_seconds']):g} s "
            "(a parked job from its checkpoint)"
        )
    else:
        why = "--manual-resume" if spec.auto_resume is False else "setting guard.auto_resume"
        lines.append(f"resume: only by you ('headroom resume'; {why})")
    return lines
