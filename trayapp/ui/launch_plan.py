"""What the launch dialog works out without Qt: the engine's GPUs as readings, the form row of
a refusal, the plain-words summary of a spec, the plan the engine makes of it, and the settings
remembered per script.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from trayapp.config import Paths, atomic_write, format_bytes
from trayapp.config import load as load_config
from trayapp.engine.status_record import Status
from trayapp.jobs import options as opts
from trayapp.jobs import plan as planmod
from trayapp.jobs import spec_values as sv
from trayapp.jobs.options import JobSpec, MemoryOptions, SpecError
from trayapp.jsonvalue import JSONObject
from trayapp.readings import GpuReading

log = logging.getLogger("headroom.ui")

MIB = 1024 * 1024
RECENT_SCRIPTS = 10
REMEMBERED_SPECS = 50

# The form row of each spec field a SpecError names (SpecError.field).
FORM_ROWS: Dict[str, str] = {
    sv.SCRIPT: "script",
    sv.ARGS: "args",
    sv.PYTHON: "python",
    sv.NAME: "name",
    sv.CWD: "cwd",
    sv.ENV: "env",
    sv.GPUS: "gpu",
    sv.CPU_ONLY: "gpu",
    sv.MEMORY_GROWTH: "growth",
    sv.VRAM_LIMIT: "vram",
    sv.VRAM_RESERVE: "vram",
    sv.ALLOCATOR: "allocator",
    sv.PRECISION: "precision",
    sv.XLA: "xla",
    sv.THREADS: "threads",
    "options.inter_threads": "threads",
    sv.RAM_BUDGET: "ram_budget",
    sv.VRAM_BUDGET: "vram_budget",
    sv.CHECKPOINT_DIR: "checkpoint",
    sv.CHECKPOINT_EVERY: "checkpoint_every",
    sv.RESUME: "resume",
    sv.FRESH: "fresh",
    sv.PRESET: "preset",
    sv.AUTO_RESUME: "auto_resume",
    sv.ON_OOM: "on_oom",
    sv.MIN_BATCH: "on_oom",
}


def gpu_choices(status: Status) -> List[Tuple[str, Any]]:
    """The GPU combo's (text, data): all GPUs (when there are several), each GPU with its free
    memory, else any GPU TensorFlow finds, and the CPU only."""
    items: List[Tuple[str, Any]] = []
    gpus = status.gpus
    if gpus:
        if len(gpus) > 1:
            items.append((f"All {len(gpus)} GPUs", "all"))
        for g in gpus:
            free, total = g.memory_free_bytes, g.memory_total_bytes
            text = f"GPU {g.index}: {g.name or 'GPU'} — "
            text += (
                f"{format_bytes(free)} free of {format_bytes(total)}"
                if total is not None
                else "memory n/a"
            )
            if g.simulated:
                text += " (simulated)"
            items.append((text, g.index))
    else:
        why = status.gpu_status.message or "no NVIDIA GPU found"
        items.append((f"Any GPU TensorFlow finds (the engine sees none: {why})", "all"))
    items.append(("CPU only", "cpu"))
    return items


def form_row(error: SpecError) -> Optional[str]:
    """The form row an error is about (by its ``field``), or None."""
    return FORM_ROWS.get(error.field or "")


def mib_text(mb: Optional[int]) -> str:
    """A size in MB (MiB) as the budget fields show it; "" for none."""
    return "" if mb is None else f"{mb} MiB"


def gib(mb: float) -> str:
    return format_bytes(mb * MIB)


def _gpu_clause(o: MemoryOptions, g: Any) -> str:
    """What TensorFlow does with GPU ``g`` under options ``o``."""
    total_mb = opts.total_mb(g)
    name = f"GPU {g.index}"
    if o.vram_limit_mb is not None:
        text = f"may use at most {gib(o.vram_limit_mb)} of {name}"
        if total_mb is not None:
            text += f", leaving {gib(max(0, total_mb - o.vram_limit_mb))} for the desktop"
        return text
    if o.vram_reserve_mb is not None:
        if total_mb is not None:
            return (
                f"may use at most {gib(max(0, total_mb - o.vram_reserve_mb))} of "
                f"{name}, leaving {gib(o.vram_reserve_mb)} for the desktop"
            )
        return f"leaves {gib(o.vram_reserve_mb)} of {name} free"
    if o.memory_growth:
        text = f"takes memory of {name} as it needs it"
        if total_mb is not None:
            text += f" (up to all {gib(total_mb)})"
        return text
    text = f"takes nearly all of {name}"
    if total_mb is not None:
        text += f"'s {gib(total_mb)}"
    return text + " at start, leaving little for the desktop"


def _gpu_part(o: MemoryOptions, views: Sequence[Any]) -> str:
    if o.cpu_only:
        return "TensorFlow runs on the CPU only (it sees no GPU)"
    if not views:
        return "the engine sees no GPU, so TensorFlow runs on the CPU unless it finds one itself"
    clauses = [_gpu_clause(o, g) for g in opts.selected_gpus(o, views)]
    if clauses:
        return "TensorFlow " + ", and ".join(clauses)
    wanted = ", ".join(str(i) for i in o.gpus or ())
    return f"the engine sees no GPU {wanted}"


def _extras_part(o: MemoryOptions) -> Optional[str]:
    extras = []
    if not o.cpu_only and o.allocator == "cuda_malloc_async":
        extras.append("CUDA's asynchronous allocator")
    if o.precision and o.precision != "float32":
        extras.append(f"{o.precision} precision")
    if o.xla is True:
        extras.append("XLA")
    if o.intra_threads or o.inter_threads:
        extras.append(
            f"{o.intra_threads or 'default'} intra-op and "
            f"{o.inter_threads or 'default'} inter-op threads"
        )
    return "with " + ", ".join(extras) if extras else None


def _guard_part(spec: JobSpec, ram_total_bytes: Optional[int]) -> str:
    guard = []
    if spec.ram_budget_mb is not None:
        text = f"above {gib(spec.ram_budget_mb)} of RAM"
        if ram_total_bytes:
            text += f" (of {format_bytes(ram_total_bytes)})"
        guard.append(text)
    if spec.vram_budget_mb is not None and not spec.options.cpu_only:
        guard.append(f"above {gib(spec.vram_budget_mb)} of GPU memory")
    if guard:
        return "the guard pauses the job " + " or ".join(guard)
    return "the guard watches the machine's free memory (no budget for this job)"


def _checkpoint_sentence(spec: JobSpec) -> str:
    if not spec.checkpoint_dir:
        return "No checkpoints: parking this job loses its training progress."
    every = (
        f"every {spec.checkpoint_every_steps} steps"
        if spec.checkpoint_every_steps
        else "every epoch"
    )
    text = f"Checkpoints go to {spec.checkpoint_dir} {every}"
    return text + (
        "; the job continues from the last one."
        if spec.resume
        else "; the job starts over and deletes the one there."
        if spec.fresh
        else ", so a parked or stopped job continues where it was."
    )


def summary_text(
    spec: JobSpec,
    gpus: Sequence[GpuReading],
    ram_total_bytes: Optional[int] = None,
    cpu_tensorflow: bool = False,
) -> str:
    """What the options mean, in plain words, e.g. "TensorFlow may use at most 6.0 GiB of
    GPU 0, leaving 2.0 GiB for the desktop; the guard pauses the job above 12.0 GiB of RAM.".
    ``cpu_tensorflow``: the interpreter's TensorFlow cannot use a GPU, so no GPU clause is
    promised."""
    gpu = _gpu_part(spec.options, gpus)
    if cpu_tensorflow and not spec.options.cpu_only:
        gpu = "this interpreter's TensorFlow runs on the CPU only, so the GPU options do nothing"
    parts = [gpu, _extras_part(spec.options), _guard_part(spec, ram_total_bytes)]
    first = "; ".join(p for p in parts if p)
    sentences = [first[:1].upper() + first[1:] + ".", _checkpoint_sentence(spec)]
    if spec.auto_resume is False:
        sentences.append("After a park it waits for you to resume it.")
    return " ".join(sentences)


# -- remembering the last settings per script ---------------------------------------------------


def engine_plan(
    spec: JobSpec, paths: Paths, gpus: Tuple[Any, ...], environ: Dict[str, str]
) -> planmod.LaunchPlan:
    """The plan the engine makes of ``spec`` launched with ``environ``, on ``gpus``, with the
    settings file of ``paths``. Raises SpecError (or ValueError) for a spec it would refuse."""
    # The job's id is only known once the engine starts it: "new" stands in for it.
    # The priority and log cap: from the settings file the engine reads.
    process = planmod.JobProcess.from_config(load_config(paths.config_file))
    return planmod.build_launch(
        spec,
        job_id="new",
        address=paths.job_address("new"),
        keyfile=str(paths.jobs_dir / "new" / "key"),
        gpus=gpus,
        base_env=environ,
        process=process,
        log_path=str(paths.jobs_dir / "new" / "log"),
    )


class RecentLaunches:
    """The recent scripts and the last spec used for each, in one JSON file. A file that
    cannot be read is treated as empty; one that cannot be written is logged."""

    def __init__(self, path: Path):
        self.path = path

    def _read(self) -> Tuple[List[str], Dict[str, JSONObject]]:
        """(the recent scripts, the last spec of each); what is not one is left out."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return [], {}
        if not isinstance(data, dict):
            return [], {}
        recent = data.get("recent")
        specs = data.get("specs")
        return (
            [s for s in (recent if isinstance(recent, list) else ()) if isinstance(s, str)],
            {
                str(k): v
                for k, v in (specs if isinstance(specs, dict) else {}).items()
                if isinstance(v, dict)
            },
        )

    def recent(self) -> List[str]:
        """Scripts launched lately, newest first."""
        return self._read()[0]

    def spec_for(self, script: str) -> Optional[JSONObject]:
        """The spec (``JobSpec.to_json()``) last launched for ``script``, or None."""
        return self._read()[1].get(os.path.abspath(script))

    def remember(self, spec: JSONObject) -> None:
        script = os.path.abspath(str(spec.get("script") or ""))
        recent, specs = self._read()
        recent = [script] + [s for s in recent if s != script]
        del recent[RECENT_SCRIPTS:]
        specs.pop(script, None)
        specs[script] = spec
        while len(specs) > REMEMBERED_SPECS:
            specs.pop(next(iter(specs)))
        data = {"recent": recent, "specs": specs}
        try:
            atomic_write(self.path, json.dumps(data, indent=1) + "\n", mode=0o600)
        except OSError as e:
            log.warning("cannot remember the launch settings in %s: %s", self.path, e)
