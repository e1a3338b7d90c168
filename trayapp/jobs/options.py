"""What a job is: the script, its interpreter, and the memory options that really exist.

``MemoryOptions`` holds the TensorFlow knobs (``None`` everywhere means "TensorFlow's default"),
``JobSpec`` the whole job (both defined in ``jobspec``, given here too). ``validate`` refuses
what cannot work with one line naming the flag and warns about what does nothing;
``apply_preset`` fills what the user left unset; ``spec_from_cli`` is the ``headroom run`` side.
How typed values are read (sizes, ``KEY=VALUE``, GPU lists), the flags, and ``SpecError`` (which
names the spec field it is about) are in ``spec_values``.

Presets and explicit choices: a preset only fills options the user left unset. The VRAM options
(growth, limit, reserve) are one group, because TensorFlow cannot combine growth with a limit on
one GPU: any user choice in the group replaces the preset's choice for the whole group. So
``--preset desktop-safe --vram-limit 4096`` means a 4096 MiB limit and no growth.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from dataclasses import replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from trayapp.jobs import spec_values as sv
from trayapp.jobs.checkpoint_folder import checkpoint_position, holds_checkpoint
from trayapp.jobs.gpu_choice import (  # where they were
    FLOAT16_MIN_CAPABILITY,
    compute_capability,
    float16_ok,
    selected_gpus,
    total_mb,
)
from trayapp.jobs.jobspec import JobSpec as JobSpec  # where they were
from trayapp.jobs.jobspec import MemoryOptions as MemoryOptions
from trayapp.jobs.spec_values import (  # the flags and choices, where they were
    ALLOCATORS,
    MIB,
    PRECISIONS,
    PRESETS,
    SpecError,
)
from trayapp.jobs.spec_values import (
    add_run_arguments as add_run_arguments,
)
from trayapp.readings import GpuReading
from trayapp.runner import protocol

DESKTOP_RESERVE_MB = 1024
# The least RAM a job takes once its Python has imported TensorFlow: a RAM budget under it is
# reached as the job starts. Measured (peak RSS): 487 MiB after `import tensorflow` (2.21, CPU
# build), 512 MiB after a first fit of a small Keras model.
TF_RAM_FLOOR_MB = 480
DESKTOP_RAM_PERCENT = 75

# Environment variables that TensorFlow does not read (though advice on the web uses them), and
# the option that does what was meant.
UNREAD_VARIABLES: Dict[str, str] = {
    "TF_MEMORY_ALLOCATION": "--vram-limit MiB (or --memory-growth)",
    "TF_GPU_MEMORY_ALLOCATION": "--vram-limit MiB (or --memory-growth)",
    "TF_GPU_MEMORY_FRACTION": "--vram-limit MiB",
    "TF_PER_PROCESS_GPU_MEMORY_FRACTION": "--vram-limit MiB",
    "GPU_MEMORY_FRACTION": "--vram-limit MiB",
    "TF_GPU_MEMORY_LIMIT": "--vram-limit MiB",
    "TF_MEMORY_LIMIT": "--vram-limit MiB",
    "CUDA_MEMORY_LIMIT": "--vram-limit MiB",
    "CUDA_MEMORY_FRACTION": "--vram-limit MiB",
    "TF_MEMORY_GROWTH": "--memory-growth",
    "TF_GPU_MEMORY_GROWTH": "--memory-growth",
    "TF_GPU_ALLOW_GROWTH": "--memory-growth",
    "TF_ALLOW_GROWTH": "--memory-growth",
    "TF_FORCE_GPU_MEMORY_GROWTH": "--memory-growth",
    "TF_ENABLE_XLA": "--xla",
    "TF_XLA_ENABLE": "--xla",
    "TF_NUM_THREADS": "--threads INTRA[,INTER]",
    "TF_MIXED_PRECISION": "--precision",
}

# The job channel's variables: Headroom sets them, the user may not.
RESERVED_VARIABLES = (
    protocol.ENV_JOB_ID,
    protocol.ENV_ADDRESS,
    protocol.ENV_KEYFILE,
    protocol.ENV_OPTIONS,
)


# ---------------------------------------------------------------------------------------------
# Presets


def _has_vram_choice(o: MemoryOptions) -> bool:
    return (
        o.memory_growth is not None or o.vram_limit_mb is not None or o.vram_reserve_mb is not None
    )


def apply_preset(
    spec: JobSpec,
    name: str,
    gpus: Sequence[GpuReading] = (),
    ram_total_bytes: Optional[int] = None,
) -> JobSpec:
    """The spec with the preset's values where the user left options unset (see the module
    docstring); applying it again changes nothing. Raises SpecError for an unknown preset or one
    that contradicts an explicit choice (cpu-only with --gpu)."""
    if name not in PRESETS:
        raise SpecError(
            f"--preset: unknown preset {name!r} (choose {', '.join(PRESETS)})", sv.PRESET
        )
    o = spec.options
    changes: Dict[str, Any] = {}
    ram_budget = spec.ram_budget_mb
    if name == "cpu-only":
        if o.gpus:
            raise SpecError("--preset cpu-only cannot be combined with --gpu", sv.PRESET)
        changes["cpu_only"] = True
    elif name == "desktop-safe":
        if not o.cpu_only and not _has_vram_choice(o):
            selected = selected_gpus(o, gpus)
            drives_display = [
                g for g in selected if g.display_active and g.memory_total_bytes is not None
            ]
            if drives_display:
                changes["vram_reserve_mb"] = DESKTOP_RESERVE_MB
            else:
                changes["memory_growth"] = True
        if ram_budget is None and ram_total_bytes:
            ram_budget = ram_total_bytes * DESKTOP_RAM_PERCENT // 100 // MIB
    elif name == "throughput":
        if not o.cpu_only:
            if not _has_vram_choice(o):
                changes["memory_growth"] = False
            if o.allocator is None:
                changes["allocator"] = "cuda_malloc_async"
            if o.precision is None and float16_ok(selected_gpus(o, gpus)):
                changes["precision"] = "mixed_float16"
        if o.xla is None:
            changes["xla"] = True
    return replace(spec, options=replace(o, **changes), preset=name, ram_budget_mb=ram_budget)


# ---------------------------------------------------------------------------------------------
# Validation


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def env_warnings(
    env: Mapping[str, str], spec: JobSpec, source: str = "--env", growth: bool = True
) -> List[str]:
    """Warnings for variables in ``env`` that TensorFlow ignores, and (``growth``) for a
    TF_FORCE_GPU_ALLOW_GROWTH that fights the options."""
    out = []
    o = spec.options
    for key in env:
        real = UNREAD_VARIABLES.get(key.upper())
        if real:
            out.append(f"TensorFlow does not read {key}; use {real}")
    growth_value = env.get("TF_FORCE_GPU_ALLOW_GROWTH") if growth else None
    if growth_value is not None and _truthy(growth_value):
        if o.vram_limit_mb is not None or o.vram_reserve_mb is not None:
            out.append(
                f"TF_FORCE_GPU_ALLOW_GROWTH={growth_value} ({source}) turns on memory growth, "
                "which TensorFlow cannot combine with a VRAM limit on one GPU; drop the variable"
            )
        elif o.memory_growth is False:
            out.append(
                f"TF_FORCE_GPU_ALLOW_GROWTH={growth_value} ({source}) turns memory growth back on "
                "despite --no-memory-growth"
            )
    return out


def resolve_python(python: str) -> str:
    """An interpreter given as a bare name (``python3.11``) resolved on PATH; a path as is.
    Raises SpecError when a bare name is not found."""
    if os.sep in python or (os.altsep and os.altsep in python):
        return python
    found = shutil.which(python)
    if found is None:
        raise SpecError(f"--python: {python} not found on PATH", sv.PYTHON)
    return found


def script_path(spec: JobSpec) -> str:
    """The script as an absolute path (a relative one is relative to the spec's cwd)."""
    if os.path.isabs(spec.script):
        return spec.script
    return os.path.abspath(os.path.join(spec.cwd or os.getcwd(), spec.script))


def check_python(python: str) -> None:
    """Raise SpecError unless ``python`` is an executable file (``--python``)."""
    if not os.path.exists(python):
        raise SpecError(f"--python: not found: {python}", sv.PYTHON)
    if os.path.isdir(python) or not os.access(python, os.X_OK):
        raise SpecError(f"--python: not executable: {python}", sv.PYTHON)


def validate(spec: JobSpec, gpus: Sequence[GpuReading] = (), check_paths: bool = True) -> List[str]:
    """Warnings (one line each) for a spec that can run; raises SpecError for one that cannot,
    with ``field`` set to the spec field it is about.

    ``gpus`` are NVML's readings at launch: limits are checked against them (nothing is checked
    when there are none). ``check_paths`` looks at the script, folder and interpreter on disk.
    """
    _check_choices(spec)
    _check_numbers(spec)
    _check_gpu_list(spec.options)
    warnings = _check_combinations(spec)
    warnings.extend(_budget_warnings(spec))
    warnings.extend(_check_against_gpus(spec.options, gpus))
    warnings.extend(_check_env(spec))
    warnings.extend(_preset_warnings(spec, gpus))
    if check_paths:
        _check_paths(spec)
    return warnings


def _check_choices(spec: JobSpec) -> None:
    o = spec.options
    if spec.preset is not None and spec.preset not in PRESETS:
        raise SpecError(
            f"--preset: unknown preset {spec.preset!r} (choose {', '.join(PRESETS)})", sv.PRESET
        )
    if o.allocator is not None and o.allocator not in ALLOCATORS:
        raise SpecError(
            f"--allocator: unknown allocator {o.allocator!r} (choose {' or '.join(ALLOCATORS)})",
            sv.ALLOCATOR,
        )
    if o.precision is not None and o.precision not in PRECISIONS:
        raise SpecError(
            f"--precision: unknown precision {o.precision!r} (choose {', '.join(PRECISIONS)})",
            sv.PRECISION,
        )
    if spec.on_oom not in sv.ON_OOM_CHOICES:
        raise SpecError(
            f"--on-oom: {spec.on_oom!r} is not one of {', '.join(sv.ON_OOM_CHOICES)}", sv.ON_OOM
        )
    if spec.accumulation is not None and not 1 <= spec.accumulation <= 1024:
        raise SpecError(f"accumulation: {spec.accumulation} is not 1 to 1024", "accumulation")
    if spec.min_batch is not None and spec.min_batch < 1:
        raise SpecError(
            f"--min-batch: {spec.min_batch} is not a batch size; give 1 or more", sv.MIN_BATCH
        )


def _check_numbers(spec: JobSpec) -> None:
    o = spec.options
    for flag, value, field in (
        ("--vram-limit", o.vram_limit_mb, sv.VRAM_LIMIT),
        ("--vram-reserve", o.vram_reserve_mb, sv.VRAM_RESERVE),
        ("--ram-budget", spec.ram_budget_mb, sv.RAM_BUDGET),
        ("--vram-budget", spec.vram_budget_mb, sv.VRAM_BUDGET),
    ):
        if value is not None and value <= 0:
            raise SpecError(f"{flag}: {value} MiB is not a size; give more than 0 MiB", field)
    if spec.checkpoint_every_steps is not None and spec.checkpoint_every_steps <= 0:
        raise SpecError(
            f"--checkpoint-every: {spec.checkpoint_every_steps} is not a number of steps; "
            "give 1 or more",
            sv.CHECKPOINT_EVERY,
        )
    for value in (o.intra_threads, o.inter_threads):
        if value is not None and value < 0:
            raise SpecError(
                f"--threads: {value} is negative; give 0 (TensorFlow's choice) or more", sv.THREADS
            )


def _check_gpu_list(o: MemoryOptions) -> None:
    if o.gpus is not None:
        if not o.gpus:
            raise SpecError("--gpu: no GPU given (use --cpu-only for none)", sv.GPUS)
        if any(i < 0 for i in o.gpus):
            raise SpecError(f"--gpu: GPU numbers start at 0, not {min(o.gpus)}", sv.GPUS)
        if len(set(o.gpus)) != len(o.gpus):
            raise SpecError("--gpu: a GPU is listed twice", sv.GPUS)


def _check_combinations(spec: JobSpec) -> List[str]:
    """Refuses options that exclude each other; warns about those --cpu-only makes moot."""
    o = spec.options
    if o.cpu_only and o.gpus:
        raise SpecError("--cpu-only and --gpu cannot be combined", sv.CPU_ONLY)
    if o.vram_limit_mb is not None and o.vram_reserve_mb is not None:
        raise SpecError(
            "--vram-limit and --vram-reserve cannot be combined: choose one", sv.VRAM_LIMIT
        )
    if o.memory_growth and (o.vram_limit_mb is not None or o.vram_reserve_mb is not None):
        raise SpecError(
            "memory growth and a VRAM limit cannot be combined on one GPU in TensorFlow: "
            "choose --memory-growth or a limit",
            sv.MEMORY_GROWTH,
        )
    if spec.resume and not spec.checkpoint_dir:
        raise SpecError("--resume needs --checkpoint-dir (where the checkpoints are)", sv.RESUME)
    if spec.fresh and spec.resume:
        raise SpecError(
            "--resume and --fresh cannot be combined: continue, or start over", sv.RESUME
        )
    if spec.fresh and not spec.checkpoint_dir:
        raise SpecError(
            "--fresh needs --checkpoint-dir (the checkpoint it starts over from)", sv.FRESH
        )
    if spec.checkpoint_every_steps is not None and not spec.checkpoint_dir:
        raise SpecError("--checkpoint-every needs --checkpoint-dir", sv.CHECKPOINT_EVERY)
    if spec.name is not None and (not spec.name.strip() or "\n" in spec.name):
        raise SpecError("--name: give a name on one line", sv.NAME)
    if not o.cpu_only:
        return []
    ignored: Tuple[Tuple[str, Any], ...] = (
        ("--memory-growth", o.memory_growth),
        ("--vram-limit", o.vram_limit_mb),
        ("--vram-reserve", o.vram_reserve_mb),
        ("--allocator", o.allocator),
        ("--vram-budget", spec.vram_budget_mb),
    )
    return [f"{flag} has no effect with --cpu-only" for flag, value in ignored if value is not None]


def _budget_warnings(spec: JobSpec) -> List[str]:
    """A RAM budget the job reaches as it starts (its TensorFlow alone takes more)."""
    budget = spec.ram_budget_mb
    if budget is None or budget >= TF_RAM_FLOOR_MB:
        return []
    return [
        f"--ram-budget {budget} MiB is below the {TF_RAM_FLOOR_MB} MiB that a Python takes "
        "once it has imported TensorFlow: the guard pauses the job at its budget as soon "
        "as it starts"
    ]


def _check_against_gpus(o: MemoryOptions, gpus: Sequence[GpuReading]) -> List[str]:
    """The GPU options against NVML's readings (a warning when there are none)."""
    if not gpus:
        if not o.cpu_only and (
            o.gpus or o.vram_limit_mb is not None or o.vram_reserve_mb is not None
        ):
            return ["no GPU readings (NVML): the GPU options were not checked against a GPU"]
        return []
    if o.cpu_only:
        return []
    indexes = sorted(g.index for g in gpus)
    for i in o.gpus or ():
        if i not in indexes:
            have = ", ".join(str(x) for x in indexes)
            raise SpecError(f"--gpu: there is no GPU {i} (this machine has GPU {have})", sv.GPUS)
    for g in selected_gpus(o, gpus):
        total = total_mb(g)
        if total is None:
            if o.vram_reserve_mb is not None:
                raise SpecError(
                    f"--vram-reserve: GPU {g.index}'s total memory is unknown; "
                    "use --vram-limit MiB",
                    sv.VRAM_RESERVE,
                )
            continue
        if o.vram_limit_mb is not None and o.vram_limit_mb > total:
            raise SpecError(
                f"--vram-limit: {o.vram_limit_mb} MiB is more than GPU {g.index} has ({total} MiB)",
                sv.VRAM_LIMIT,
            )
        if o.vram_reserve_mb is not None and o.vram_reserve_mb >= total:
            raise SpecError(
                f"--vram-reserve: {o.vram_reserve_mb} MiB is not less than GPU {g.index}'s "
                f"total ({total} MiB)",
                sv.VRAM_RESERVE,
            )
    return []


def _check_env(spec: JobSpec) -> List[str]:
    """Refuses environment entries that are not KEY=VALUE or that Headroom sets."""
    for key, entry in spec.env:
        if not key or "=" in key or "\0" in key or "\0" in entry or key != key.strip():
            raise SpecError(f"--env: {key}={entry} is not KEY=VALUE", sv.ENV)
        if key in RESERVED_VARIABLES:
            raise SpecError(f"--env: {key} is set by Headroom for the job channel", sv.ENV)
    return env_warnings(dict(spec.env), spec)


def _preset_warnings(spec: JobSpec, gpus: Sequence[GpuReading]) -> List[str]:
    o = spec.options
    if spec.preset != "throughput" or o.cpu_only or o.precision is not None:
        return []
    caps = [(g.index, compute_capability(g)) for g in selected_gpus(o, gpus)]
    if not caps or any(c is None for _, c in caps):
        return [
            "--preset throughput: the GPU's compute capability is unknown, so precision "
            "stays float32 (mixed_float16 needs compute capability 7.0 or newer)"
        ]
    return [
        f"--preset throughput: GPU {i} has compute capability {c[0]}.{c[1]}; "
        "mixed_float16 needs 7.0 or newer, so precision stays float32"
        for i, c in caps
        if c is not None and c < FLOAT16_MIN_CAPABILITY
    ]


def _check_paths(spec: JobSpec) -> None:
    if spec.cwd is not None and not os.path.isdir(spec.cwd):
        raise SpecError(f"--cwd: folder not found: {spec.cwd}", sv.CWD)
    path = script_path(spec)
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "__main__.py")):
            raise SpecError(
                f"script not found: {spec.script} (a folder without __main__.py)", sv.SCRIPT
            )
    elif not os.path.isfile(path):
        raise SpecError(f"script not found: {spec.script}", sv.SCRIPT)
    if spec.python is not None:
        check_python(resolve_python(spec.python))
    if spec.checkpoint_dir is not None:
        _check_writable(spec.checkpoint_dir)
    if spec.checkpoint_dir is not None and os.path.exists(spec.checkpoint_dir):
        if not spec.resume and not spec.fresh and holds_checkpoint(spec.checkpoint_dir):
            where, finished = checkpoint_position(spec.checkpoint_dir)
            if finished:
                raise SpecError(
                    f"--checkpoint-dir: {spec.checkpoint_dir} holds the checkpoint of a run that "
                    f"finished{where}; start over with --fresh (it is deleted as the run "
                    "starts), or give --resume to run only the script's code after fit()",
                    sv.CHECKPOINT_DIR,
                )
            raise SpecError(
                f"--checkpoint-dir: {spec.checkpoint_dir} holds a checkpoint{where}; continue "
                "from it with --resume, or start over with --fresh (it is deleted as the run "
                "starts)",
                sv.CHECKPOINT_DIR,
            )


def _check_writable(folder: str) -> None:
    """The checkpoint folder, or the folder it is to be made in, takes a file (tried for real:
    permission bits say nothing of a read-only disk, nor of root). Raises SpecError."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise SpecError(f"--checkpoint-dir: not a folder: {folder}", sv.CHECKPOINT_DIR)
    where = folder
    while not os.path.exists(where):
        parent = os.path.dirname(where)
        if parent == where:
            break
        where = parent
    if not os.path.isdir(where):
        raise SpecError(
            f"--checkpoint-dir: {where} is not a folder, so {folder} cannot be made",
            sv.CHECKPOINT_DIR,
        )
    try:
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as e:
        made = "" if where == folder else f" ({folder} would be made in {where})"
        raise SpecError(
            f"--checkpoint-dir: cannot write in {where}{made}: {e.strerror or e}", sv.CHECKPOINT_DIR
        ) from None


# ---------------------------------------------------------------------------------------------
# headroom run


def spec_from_cli(ns: argparse.Namespace) -> JobSpec:
    """The JobSpec of parsed ``headroom run`` arguments (flags from ``add_run_arguments``).

    Paths become absolute against the current folder, which is also the job's working folder
    unless ``--cwd`` says otherwise (the job is started by the engine, elsewhere); a bare
    ``--python`` name is looked up on PATH. The preset is recorded, not applied: it needs the
    GPU readings (``apply_preset``). Raises SpecError (one line) on malformed values.
    """

    def arg(name: str, default: Any = None) -> Any:
        return getattr(ns, name, default)

    script = arg("script")
    if not script:
        raise SpecError("no script given", sv.SCRIPT)
    script_args = list(arg("script_args") or [])
    if script_args and script_args[0] == "--":
        script_args = script_args[1:]
    intra, inter = sv.parse_threads(arg("threads"))
    python = arg("python")
    if python:
        python = resolve_python(python)
        python = os.path.abspath(python)
    cwd = arg("cwd")
    cwd = os.path.abspath(cwd) if cwd else os.getcwd()
    checkpoint_dir = arg("checkpoint_dir")
    options = MemoryOptions(
        gpus=sv.parse_gpus(arg("gpu")),
        cpu_only=bool(arg("cpu_only", False)),
        memory_growth=arg("memory_growth"),
        vram_limit_mb=sv.parse_mb("--vram-limit", arg("vram_limit"), sv.VRAM_LIMIT),
        vram_reserve_mb=sv.parse_mb("--vram-reserve", arg("vram_reserve"), sv.VRAM_RESERVE),
        allocator=arg("allocator"),
        precision=arg("precision"),
        xla=arg("xla"),
        intra_threads=intra,
        inter_threads=inter,
    )
    return JobSpec(
        script=os.path.abspath(script),
        args=tuple(script_args),
        python=python,
        name=arg("name"),
        cwd=cwd,
        env=sv.parse_env(arg("env")),
        options=options,
        ram_budget_mb=sv.parse_mb("--ram-budget", arg("ram_budget"), sv.RAM_BUDGET),
        vram_budget_mb=sv.parse_mb("--vram-budget", arg("vram_budget"), sv.VRAM_BUDGET),
        checkpoint_dir=os.path.abspath(checkpoint_dir) if checkpoint_dir else None,
        checkpoint_every_steps=sv.parse_int(
            "--checkpoint-every", arg("checkpoint_every"), "a number of steps", sv.CHECKPOINT_EVERY
        ),
        resume=bool(arg("resume", False)),
        fresh=bool(arg("fresh", False)),
        preset=arg("preset"),
        auto_resume=False if arg("manual_resume", False) else None,
        on_oom=arg("on_oom") or sv.ON_OOM_SHRINK,
        min_batch=sv.parse_int("--min-batch", arg("min_batch"), "a batch size", sv.MIN_BATCH),
        fit_batch=arg("fit_batch") is not False,  # on unless --no-fit-batch
    )
