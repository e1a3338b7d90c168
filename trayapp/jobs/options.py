"""What a job is: the script, its interpreter, and the memory options that really exist.

``MemoryOptions`` holds the TensorFlow knobs (``None`` everywhere means "TensorFlow's default"),
``JobSpec`` the whole job. ``validate`` refuses what cannot work with one line naming the flag and
warns about what does nothing; ``apply_preset`` fills what the user left unset; ``spec_from_cli``
and ``add_run_arguments`` are the ``headroom run`` side.

Presets and explicit choices: a preset only fills options the user left unset. The VRAM options
(growth, limit, reserve) are one group, because TensorFlow cannot combine growth with a limit on
one GPU: any user choice in the group replaces the preset's choice for the whole group. So
``--preset desktop-safe --vram-limit 4096`` means a 4096 MB limit and no growth.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from dataclasses import dataclass, fields, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from trayapp.config import ConfigError, parse_size
from trayapp.probes.snapshot import GpuReading
from trayapp.runner import protocol
from trayapp.text import one_line

MIB = 1024 * 1024
ALLOCATORS = ("bfc", "cuda_malloc_async")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")

PRESETS: Dict[str, str] = {
    "desktop-safe": (
        "memory growth, or on a GPU that drives a display 1024 MB of VRAM left free for the "
        "desktop (growth and a limit cannot be combined); a RAM budget of 75% of total RAM"
    ),
    "throughput": (
        "no memory growth, the cuda_malloc_async allocator, mixed_float16 where every GPU has "
        "compute capability 7.0 or newer, XLA on"
    ),
    "cpu-only": "no GPU: CUDA_VISIBLE_DEVICES=-1",
}
DESKTOP_RESERVE_MB = 1024
DESKTOP_RAM_PERCENT = 75
FLOAT16_MIN_CAPABILITY = (7, 0)

# Environment variables that TensorFlow does not read (though advice on the web uses them), and
# the option that does what was meant.
UNREAD_VARIABLES: Dict[str, str] = {
    "TF_MEMORY_ALLOCATION": "--vram-limit MB (or --memory-growth)",
    "TF_GPU_MEMORY_ALLOCATION": "--vram-limit MB (or --memory-growth)",
    "TF_GPU_MEMORY_FRACTION": "--vram-limit MB",
    "TF_PER_PROCESS_GPU_MEMORY_FRACTION": "--vram-limit MB",
    "GPU_MEMORY_FRACTION": "--vram-limit MB",
    "TF_GPU_MEMORY_LIMIT": "--vram-limit MB",
    "TF_MEMORY_LIMIT": "--vram-limit MB",
    "CUDA_MEMORY_LIMIT": "--vram-limit MB",
    "CUDA_MEMORY_FRACTION": "--vram-limit MB",
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


class SpecError(ValueError):
    """A job spec that cannot run; the message is one line naming the flag or field (a value
    quoted in it shows its control characters as escapes)."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


@dataclass(frozen=True)
class MemoryOptions:
    gpus: Optional[Tuple[int, ...]] = None  # None: every GPU
    cpu_only: bool = False
    memory_growth: Optional[bool] = None  # None: TensorFlow's default (no growth)
    vram_limit_mb: Optional[int] = None
    vram_reserve_mb: Optional[int] = None  # leave this much free: limit = GPU total - reserve
    allocator: Optional[str] = None  # "bfc" | "cuda_malloc_async"
    precision: Optional[str] = None  # "float32" | "mixed_float16" | "mixed_bfloat16"
    xla: Optional[bool] = None
    intra_threads: Optional[int] = None
    inter_threads: Optional[int] = None


@dataclass(frozen=True)
class JobSpec:
    script: str
    args: Tuple[str, ...] = ()
    python: Optional[str] = None  # None: a venv beside the script, else the current Python
    name: Optional[str] = None
    cwd: Optional[str] = None  # None: the script's folder
    env: Tuple[Tuple[str, str], ...] = ()
    options: MemoryOptions = MemoryOptions()
    ram_budget_mb: Optional[int] = None
    vram_budget_mb: Optional[int] = None
    checkpoint_dir: Optional[str] = None
    checkpoint_every_steps: Optional[int] = None  # None: every epoch
    resume: bool = False
    fresh: bool = False  # start over on a checkpoint folder that holds one (deleted as it starts)
    preset: Optional[str] = None
    auto_resume: Optional[bool] = None  # None: the guard's default

    def to_json(self) -> Dict[str, Any]:
        """A JSON-able dict; ``JobSpec.from_json`` reads it back unchanged."""
        out: Dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "args":
                value = list(value)
            elif f.name == "env":
                value = [[k, v] for k, v in value]
            elif f.name == "options":
                value = {
                    g.name: (
                        list(getattr(value, g.name))
                        if g.name == "gpus" and getattr(value, g.name) is not None
                        else getattr(value, g.name)
                    )
                    for g in fields(MemoryOptions)
                }
            out[f.name] = value
        return out

    @classmethod
    def from_json(cls, d: Any) -> JobSpec:
        """The spec from ``to_json``'s dict; raises SpecError (one line) on unknown fields or
        wrong types."""
        if not isinstance(d, Mapping):
            raise SpecError("job spec: expected a JSON object")
        known = {f.name for f in fields(cls)}
        for key in d:
            if key not in known:
                raise SpecError(f"job spec: unknown field {key!r}")
        if "script" not in d:
            raise SpecError("job spec: the field 'script' is missing")
        values: Dict[str, Any] = {
            "script": _want_str("script", d["script"]),
            "args": tuple(_want_str_list("args", d.get("args", []))),
            "python": _want_opt_str("python", d.get("python")),
            "name": _want_opt_str("name", d.get("name")),
            "cwd": _want_opt_str("cwd", d.get("cwd")),
            "env": _want_env("env", d.get("env", [])),
            "options": _options_from_json(d.get("options", {})),
            "ram_budget_mb": _want_opt_int("ram_budget_mb", d.get("ram_budget_mb")),
            "vram_budget_mb": _want_opt_int("vram_budget_mb", d.get("vram_budget_mb")),
            "checkpoint_dir": _want_opt_str("checkpoint_dir", d.get("checkpoint_dir")),
            "checkpoint_every_steps": _want_opt_int(
                "checkpoint_every_steps", d.get("checkpoint_every_steps")
            ),
            "resume": _want_bool("resume", d.get("resume", False)),
            "fresh": _want_bool("fresh", d.get("fresh", False)),
            "preset": _want_opt_str("preset", d.get("preset")),
            "auto_resume": _want_opt_bool("auto_resume", d.get("auto_resume")),
        }
        return cls(**values)


# ---------------------------------------------------------------------------------------------
# JSON type checks


def _bad(name: str, what: str, value: Any) -> SpecError:
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return SpecError(f"job spec: {name} must be {what}, not {shown}")


def _want_str(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise _bad(name, "a string", v)
    return v


def _want_opt_str(name: str, v: Any) -> Optional[str]:
    return None if v is None else _want_str(name, v)


def _want_bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise _bad(name, "true or false", v)
    return v


def _want_opt_bool(name: str, v: Any) -> Optional[bool]:
    return None if v is None else _want_bool(name, v)


def _want_opt_int(name: str, v: Any) -> Optional[int]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(name, "a whole number or null", v)
    return v


def _want_str_list(name: str, v: Any) -> List[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise _bad(name, "a list of strings", v)
    return v


def _want_env(name: str, v: Any) -> Tuple[Tuple[str, str], ...]:
    if isinstance(v, Mapping):
        items = list(v.items())
    elif isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 for p in v):
        items = [(p[0], p[1]) for p in v]
    else:
        raise _bad(name, "a list of [KEY, VALUE] pairs", v)
    if not all(isinstance(k, str) and isinstance(x, str) for k, x in items):
        raise _bad(name, "a list of [KEY, VALUE] string pairs", v)
    return tuple(items)


def _options_from_json(d: Any) -> MemoryOptions:
    if not isinstance(d, Mapping):
        raise _bad("options", "an object", d)
    known = {f.name for f in fields(MemoryOptions)}
    for key in d:
        if key not in known:
            raise SpecError(f"job spec: unknown field 'options.{key}'")
    gpus = d.get("gpus")
    if gpus is not None:
        if not isinstance(gpus, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in gpus
        ):
            raise _bad("options.gpus", "a list of GPU numbers or null", gpus)
        gpus = tuple(gpus)
    return MemoryOptions(
        gpus=gpus,
        cpu_only=_want_bool("options.cpu_only", d.get("cpu_only", False)),
        memory_growth=_want_opt_bool("options.memory_growth", d.get("memory_growth")),
        vram_limit_mb=_want_opt_int("options.vram_limit_mb", d.get("vram_limit_mb")),
        vram_reserve_mb=_want_opt_int("options.vram_reserve_mb", d.get("vram_reserve_mb")),
        allocator=_want_opt_str("options.allocator", d.get("allocator")),
        precision=_want_opt_str("options.precision", d.get("precision")),
        xla=_want_opt_bool("options.xla", d.get("xla")),
        intra_threads=_want_opt_int("options.intra_threads", d.get("intra_threads")),
        inter_threads=_want_opt_int("options.inter_threads", d.get("inter_threads")),
    )


# ---------------------------------------------------------------------------------------------
# GPUs


def selected_gpus(options: MemoryOptions, gpus: Sequence[GpuReading]) -> List[GpuReading]:
    """The readings of the GPUs the job will use (none with --cpu-only)."""
    if options.cpu_only:
        return []
    if options.gpus is None:
        return list(gpus)
    wanted = set(options.gpus)
    return [g for g in gpus if g.index in wanted]


def compute_capability(gpu: GpuReading) -> Optional[Tuple[int, int]]:
    """The GPU's CUDA compute capability as (major, minor), or None when the reading lacks it."""
    value = getattr(gpu, "compute_capability", None)
    if value is None:
        return None
    try:
        if isinstance(value, str):
            major, _, minor = value.partition(".")
            return int(major), int(minor or 0)
        major, minor = value
        return int(major), int(minor)
    except (TypeError, ValueError):
        return None


def total_mb(gpu: GpuReading) -> Optional[int]:
    if gpu.memory_total_bytes is None:
        return None
    return gpu.memory_total_bytes // MIB


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
        raise SpecError(f"--preset: unknown preset {name!r} (choose {', '.join(PRESETS)})")
    o = spec.options
    changes: Dict[str, Any] = {}
    ram_budget = spec.ram_budget_mb
    if name == "cpu-only":
        if o.gpus:
            raise SpecError("--preset cpu-only cannot be combined with --gpu")
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
            if o.precision is None and _float16_ok(selected_gpus(o, gpus)):
                changes["precision"] = "mixed_float16"
        if o.xla is None:
            changes["xla"] = True
    return replace(spec, options=replace(o, **changes), preset=name, ram_budget_mb=ram_budget)


def _float16_ok(selected: Sequence[GpuReading]) -> bool:
    caps = [compute_capability(g) for g in selected]
    return bool(caps) and all(c is not None and c >= FLOAT16_MIN_CAPABILITY for c in caps)


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
        raise SpecError(f"--python: {python} not found on PATH")
    return found


def script_path(spec: JobSpec) -> str:
    """The script as an absolute path (a relative one is relative to the spec's cwd)."""
    if os.path.isabs(spec.script):
        return spec.script
    return os.path.abspath(os.path.join(spec.cwd or os.getcwd(), spec.script))


def validate(spec: JobSpec, gpus: Sequence[GpuReading] = (), check_paths: bool = True) -> List[str]:
    """Warnings (one line each) for a spec that can run; raises SpecError for one that cannot.

    ``gpus`` are NVML's readings at launch: limits are checked against them (nothing is checked
    when there are none). ``check_paths`` looks at the script, folder and interpreter on disk.
    """
    o = spec.options
    warnings: List[str] = []
    if spec.preset is not None and spec.preset not in PRESETS:
        raise SpecError(f"--preset: unknown preset {spec.preset!r} (choose {', '.join(PRESETS)})")
    if o.allocator is not None and o.allocator not in ALLOCATORS:
        raise SpecError(
            f"--allocator: unknown allocator {o.allocator!r} (choose {' or '.join(ALLOCATORS)})"
        )
    if o.precision is not None and o.precision not in PRECISIONS:
        raise SpecError(
            f"--precision: unknown precision {o.precision!r} (choose {', '.join(PRECISIONS)})"
        )
    for flag, value in (
        ("--vram-limit", o.vram_limit_mb),
        ("--vram-reserve", o.vram_reserve_mb),
        ("--ram-budget", spec.ram_budget_mb),
        ("--vram-budget", spec.vram_budget_mb),
    ):
        if value is not None and value <= 0:
            raise SpecError(f"{flag}: {value} MB is not a size; give more than 0 MB")
    if spec.checkpoint_every_steps is not None and spec.checkpoint_every_steps <= 0:
        raise SpecError(
            f"--checkpoint-every: {spec.checkpoint_every_steps} is not a number of steps; "
            "give 1 or more"
        )
    for value in (o.intra_threads, o.inter_threads):
        if value is not None and value < 0:
            raise SpecError(f"--threads: {value} is negative; give 0 (TensorFlow's choice) or more")
    if o.gpus is not None:
        if not o.gpus:
            raise SpecError("--gpu: no GPU given (use --cpu-only for none)")
        if any(i < 0 for i in o.gpus):
            raise SpecError(f"--gpu: GPU numbers start at 0, not {min(o.gpus)}")
        if len(set(o.gpus)) != len(o.gpus):
            raise SpecError("--gpu: a GPU is listed twice")
    if o.cpu_only and o.gpus:
        raise SpecError("--cpu-only and --gpu cannot be combined")
    if o.vram_limit_mb is not None and o.vram_reserve_mb is not None:
        raise SpecError("--vram-limit and --vram-reserve cannot be combined: choose one")
    if o.memory_growth and (o.vram_limit_mb is not None or o.vram_reserve_mb is not None):
        raise SpecError(
            "memory growth and a VRAM limit cannot be combined on one GPU in TensorFlow: "
            "choose --memory-growth or a limit"
        )
    if o.cpu_only:
        ignored: Tuple[Tuple[str, Any], ...] = (
            ("--memory-growth", o.memory_growth),
            ("--vram-limit", o.vram_limit_mb),
            ("--vram-reserve", o.vram_reserve_mb),
            ("--allocator", o.allocator),
            ("--vram-budget", spec.vram_budget_mb),
        )
        for flag, value in ignored:
            if value is not None:
                warnings.append(f"{flag} has no effect with --cpu-only")
    if spec.resume and not spec.checkpoint_dir:
        raise SpecError("--resume needs --checkpoint-dir (where the checkpoints are)")
    if spec.fresh and spec.resume:
        raise SpecError("--resume and --fresh cannot be combined: continue, or start over")
    if spec.fresh and not spec.checkpoint_dir:
        raise SpecError("--fresh needs --checkpoint-dir (the checkpoint it starts over from)")
    if spec.checkpoint_every_steps is not None and not spec.checkpoint_dir:
        raise SpecError("--checkpoint-every needs --checkpoint-dir")
    if spec.name is not None and (not spec.name.strip() or "\n" in spec.name):
        raise SpecError("--name: give a name on one line")

    # Against NVML's readings.
    if gpus and not o.cpu_only:
        indexes = sorted(g.index for g in gpus)
        for i in o.gpus or ():
            if i not in indexes:
                have = ", ".join(str(x) for x in indexes)
                raise SpecError(f"--gpu: there is no GPU {i} (this machine has GPU {have})")
        for g in selected_gpus(o, gpus):
            total = total_mb(g)
            if total is None:
                if o.vram_reserve_mb is not None:
                    raise SpecError(
                        f"--vram-reserve: GPU {g.index}'s total memory is unknown; "
                        "use --vram-limit MB"
                    )
                continue
            if o.vram_limit_mb is not None and o.vram_limit_mb > total:
                raise SpecError(
                    f"--vram-limit: {o.vram_limit_mb} MB is more than GPU {g.index} has "
                    f"({total} MB)"
                )
            if o.vram_reserve_mb is not None and o.vram_reserve_mb >= total:
                raise SpecError(
                    f"--vram-reserve: {o.vram_reserve_mb} MB is not less than GPU {g.index}'s "
                    f"total ({total} MB)"
                )
    elif (
        not gpus
        and not o.cpu_only
        and (o.gpus or o.vram_limit_mb is not None or o.vram_reserve_mb is not None)
    ):
        warnings.append("no GPU readings (NVML): the GPU options were not checked against a GPU")

    # The user's environment entries.
    for key, entry in spec.env:
        if not key or "=" in key or "\0" in key or "\0" in entry or key != key.strip():
            raise SpecError(f"--env: {key}={entry} is not KEY=VALUE")
        if key in RESERVED_VARIABLES:
            raise SpecError(f"--env: {key} is set by Headroom for the job channel")
    warnings.extend(env_warnings(dict(spec.env), spec))

    if spec.preset == "throughput" and not o.cpu_only and o.precision is None:
        caps = [(g.index, compute_capability(g)) for g in selected_gpus(o, gpus)]
        unknown = not caps or any(c is None for _, c in caps)
        if unknown:
            warnings.append(
                "--preset throughput: the GPU's compute capability is unknown, so precision "
                "stays float32 (mixed_float16 needs compute capability 7.0 or newer)"
            )
        else:
            low = [(i, c) for i, c in caps if c is not None and c < FLOAT16_MIN_CAPABILITY]
            for i, c in low:
                warnings.append(
                    f"--preset throughput: GPU {i} has compute capability {c[0]}.{c[1]}; "
                    "mixed_float16 needs 7.0 or newer, so precision stays float32"
                )

    if check_paths:
        _check_paths(spec)
    return warnings


def _check_paths(spec: JobSpec) -> None:
    if spec.cwd is not None and not os.path.isdir(spec.cwd):
        raise SpecError(f"--cwd: folder not found: {spec.cwd}")
    path = script_path(spec)
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "__main__.py")):
            raise SpecError(f"script not found: {spec.script} (a folder without __main__.py)")
    elif not os.path.isfile(path):
        raise SpecError(f"script not found: {spec.script}")
    if spec.python is not None:
        python = resolve_python(spec.python)
        if not os.path.exists(python):
            raise SpecError(f"--python: not found: {python}")
        if os.path.isdir(python) or not os.access(python, os.X_OK):
            raise SpecError(f"--python: not executable: {python}")
    if spec.checkpoint_dir is not None and os.path.exists(spec.checkpoint_dir):
        if not os.path.isdir(spec.checkpoint_dir):
            raise SpecError(f"--checkpoint-dir: not a folder: {spec.checkpoint_dir}")
        if not spec.resume and not spec.fresh and holds_checkpoint(spec.checkpoint_dir):
            where, finished = checkpoint_position(spec.checkpoint_dir)
            if finished:
                raise SpecError(
                    f"--checkpoint-dir: {spec.checkpoint_dir} holds the checkpoint of a run that "
                    f"finished{where}; start over with --fresh (it is deleted as the run "
                    "starts), or give --resume to run only the script's code after fit()"
                )
            raise SpecError(
                f"--checkpoint-dir: {spec.checkpoint_dir} holds a checkpoint{where}; continue "
                "from it with --resume, or start over with --fresh (it is deleted as the run "
                "starts)"
            )


def checkpoint_position(folder: str) -> Tuple[str, bool]:
    """Where the last ``fit()`` of a checkpoint folder got to, as words for a message
    (" (after epoch 26)", " (in epoch 22, after step 2)", or "" when unknown), and whether
    that training finished."""
    best: Optional[Tuple[int, Dict[str, Any]]] = None
    try:
        names = os.listdir(folder)
    except OSError:
        return "", False
    for name in names:
        if not (name.startswith("fit-") and name[4:].isdigit() and len(name) < 16):
            continue
        try:
            with open(os.path.join(folder, name, "training_metadata.json"), "rb") as f:
                data = json.loads(f.read(65536))
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(data, dict) and (best is None or int(name[4:]) > best[0]):
            best = (int(name[4:]), data)
    if best is None:
        return "", False
    data = best[1]
    extra: Dict[str, Any] = data["headroom"] if isinstance(data.get("headroom"), dict) else {}
    epoch, done = data.get("epoch"), extra.get("batches_done")
    finished = extra.get("finished") is True
    if not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch < 10**9:
        return "", finished
    if isinstance(done, int) and not isinstance(done, bool) and 0 < done < 10**9:
        return f" (in epoch {epoch + 1}, after step {done})", finished
    return (f" (after epoch {epoch})" if epoch else ""), finished


def holds_checkpoint(folder: str) -> bool:
    """Whether ``folder`` holds a checkpoint a job wrote (a ``fit-<n>`` folder with its files)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    for name in names:
        if name.startswith("fit-") and name[4:].isdigit():
            sub = os.path.join(folder, name)
            if os.path.isfile(os.path.join(sub, "training_metadata.json")) or os.path.isfile(
                os.path.join(sub, "latest.weights.h5")
            ):
                return True
    return False


# ---------------------------------------------------------------------------------------------
# headroom run


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Define the ``headroom run`` flags on ``parser`` (read them back with ``spec_from_cli``)."""
    g = parser.add_argument_group("interpreter and script")
    g.add_argument(
        "--python",
        metavar="PATH",
        help="the job's Python (default: a venv beside the script, else the current one)",
    )
    g.add_argument("--name", metavar="NAME", help="a name for the job")
    g.add_argument("--cwd", metavar="DIR", help="working folder (default: the current one)")
    g.add_argument(
        "--env",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="an environment variable for the job (repeatable)",
    )
    m = parser.add_argument_group("memory options (TensorFlow)")
    which = m.add_mutually_exclusive_group()
    which.add_argument("--gpu", metavar="N[,N...]", help="the GPUs the job may use")
    which.add_argument("--cpu-only", action="store_true", help="use no GPU")
    m.add_argument(
        "--memory-growth",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="take GPU memory as needed instead of all at start",
    )
    vram = m.add_mutually_exclusive_group()
    vram.add_argument("--vram-limit", metavar="MB", help="hard cap of GPU memory per GPU")
    vram.add_argument("--vram-reserve", metavar="MB", help="leave this much free on each GPU")
    m.add_argument("--allocator", choices=ALLOCATORS, help="TensorFlow's GPU allocator")
    m.add_argument("--precision", choices=PRECISIONS, help="Keras's global dtype policy")
    m.add_argument(
        "--xla", action=argparse.BooleanOptionalAction, default=None, help="XLA auto-clustering"
    )
    m.add_argument("--threads", metavar="INTRA[,INTER]", help="TensorFlow's CPU thread pools")
    m.add_argument("--preset", choices=tuple(PRESETS), help="desktop-safe | throughput | cpu-only")
    b = parser.add_argument_group("guard and checkpoints")
    b.add_argument("--ram-budget", metavar="MB", help="RAM budget of this job for the guard")
    b.add_argument("--vram-budget", metavar="MB", help="VRAM budget of this job for the guard")
    b.add_argument("--checkpoint-dir", metavar="DIR", help="keep training progress here")
    b.add_argument(
        "--checkpoint-every",
        metavar="STEPS",
        help="checkpoint every STEPS batches (default: every epoch)",
    )
    b.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    b.add_argument(
        "--fresh",
        action="store_true",
        help="start over on a checkpoint folder that holds a checkpoint (deleted as the run "
        "starts)",
    )
    b.add_argument(
        "--manual-resume",
        action="store_true",
        help="after a park, wait for `headroom resume` instead of resuming by itself",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the launch plan and exit")
    parser.add_argument("script", metavar="SCRIPT", help="the training script")
    parser.add_argument(
        "script_args", metavar="SCRIPT_ARGS", nargs=argparse.REMAINDER, help="the script's own"
    )


def _parse_mb(flag: str, value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool):
        raise SpecError(f"{flag}: {value!r} is not a size in MB")
    if isinstance(value, int):
        return value
    text = str(value).strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return parse_size(text) // MIB
    except ConfigError:
        raise SpecError(f"{flag}: {text!r} is not a size in MB (like 4096 or 4GiB)") from None


def _parse_int(flag: str, value: Any, what: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise SpecError(f"{flag}: {value!r} is not {what}") from None


def _parse_gpus(value: Any) -> Optional[Tuple[int, ...]]:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        parts = [str(v) for v in value]
    else:
        parts = [p.strip() for p in str(value).split(",")]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise SpecError(f"--gpu: expected GPU numbers like 0 or 0,1, not {value!r}") from None


def _parse_threads(value: Any) -> Tuple[Optional[int], Optional[int]]:
    if value is None:
        return None, None
    parts = [p.strip() for p in str(value).split(",")]
    try:
        if len(parts) == 1:
            return int(parts[0]), None
        if len(parts) == 2:
            return int(parts[0]), int(parts[1])
    except ValueError:
        pass
    raise SpecError(f"--threads: expected INTRA or INTRA,INTER (whole numbers), not {value!r}")


def _parse_env(entries: Any) -> Tuple[Tuple[str, str], ...]:
    out = []
    for entry in entries or ():
        key, sep, value = str(entry).partition("=")
        if not sep or not key.strip():
            raise SpecError(f"--env: expected KEY=VALUE, not {entry!r}")
        out.append((key, value))
    return tuple(out)


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
        raise SpecError("no script given")
    script_args = list(arg("script_args") or [])
    if script_args and script_args[0] == "--":
        script_args = script_args[1:]
    intra, inter = _parse_threads(arg("threads"))
    python = arg("python")
    if python:
        python = resolve_python(python)
        python = os.path.abspath(python)
    cwd = arg("cwd")
    cwd = os.path.abspath(cwd) if cwd else os.getcwd()
    checkpoint_dir = arg("checkpoint_dir")
    options = MemoryOptions(
        gpus=_parse_gpus(arg("gpu")),
        cpu_only=bool(arg("cpu_only", False)),
        memory_growth=arg("memory_growth"),
        vram_limit_mb=_parse_mb("--vram-limit", arg("vram_limit")),
        vram_reserve_mb=_parse_mb("--vram-reserve", arg("vram_reserve")),
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
        env=_parse_env(arg("env")),
        options=options,
        ram_budget_mb=_parse_mb("--ram-budget", arg("ram_budget")),
        vram_budget_mb=_parse_mb("--vram-budget", arg("vram_budget")),
        checkpoint_dir=os.path.abspath(checkpoint_dir) if checkpoint_dir else None,
        checkpoint_every_steps=_parse_int(
            "--checkpoint-every", arg("checkpoint_every"), "a number of steps"
        ),
        resume=bool(arg("resume", False)),
        fresh=bool(arg("fresh", False)),
        preset=arg("preset"),
        auto_resume=False if arg("manual_resume", False) else None,
    )
