"""A job's spec as data: ``MemoryOptions`` (the TensorFlow knobs, ``None`` everywhere meaning
"TensorFlow's default") and ``JobSpec`` (the whole job), with their JSON (``to_json``,
``from_json``, which refuses unknown fields and wrong types in one line).

What the values may be, and the checks of a whole spec, are ``trayapp.jobs.options``'s
(``validate``), which gives these names too.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Dict, Mapping, Optional, Tuple

from trayapp.jobs import spec_values as sv
from trayapp.jobs.spec_values import SpecError
from trayapp.jsonvalue import JSONObject


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
    on_oom: str = sv.ON_OOM_SHRINK  # an out-of-memory error in fit(): shrink the batch, or stop
    min_batch: Optional[int] = None  # None: sv.MIN_BATCH_DEFAULT
    accumulation: Optional[int] = None  # start at micro-batches of batch / N (a relaunch smaller)
    fit_batch: bool = True  # before training: the largest micro-batch forecast to fit (the
    # default: the probe decides the first step's micro-batch; --no-fit-batch turns it off)
    # Resource limits for the job's process (the caller's: sv.RLIMITS), (name, soft, hard) with
    # None for unlimited; () leaves the job the engine's.
    rlimits: Tuple[Tuple[str, Optional[int], Optional[int]], ...] = ()

    def to_json(self) -> JSONObject:
        """A JSON-able dict; ``JobSpec.from_json`` reads it back unchanged."""
        out: JSONObject = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "args":
                value = list(value)
            elif f.name == "env":
                value = [[k, v] for k, v in value]
            elif f.name == "rlimits":
                value = {k: [soft, hard] for k, soft, hard in value}
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
            raise SpecError("job spec: the field 'script' is missing", sv.SCRIPT)
        values: Dict[str, Any] = {
            "script": sv.want_str("script", d["script"]),
            "args": tuple(sv.want_str_list("args", d.get("args", []))),
            "python": sv.want_opt_str("python", d.get("python")),
            "name": sv.want_opt_str("name", d.get("name")),
            "cwd": sv.want_opt_str("cwd", d.get("cwd")),
            "env": sv.want_env("env", d.get("env", [])),
            "options": _options_from_json(d.get("options", {})),
            "ram_budget_mb": sv.want_opt_int("ram_budget_mb", d.get("ram_budget_mb")),
            "vram_budget_mb": sv.want_opt_int("vram_budget_mb", d.get("vram_budget_mb")),
            "checkpoint_dir": sv.want_opt_str("checkpoint_dir", d.get("checkpoint_dir")),
            "checkpoint_every_steps": sv.want_opt_int(
                "checkpoint_every_steps", d.get("checkpoint_every_steps")
            ),
            "resume": sv.want_bool("resume", d.get("resume", False)),
            "fresh": sv.want_bool("fresh", d.get("fresh", False)),
            "preset": sv.want_opt_str("preset", d.get("preset")),
            "auto_resume": sv.want_opt_bool("auto_resume", d.get("auto_resume")),
            "on_oom": sv.want_str("on_oom", d.get("on_oom", sv.ON_OOM_SHRINK)),
            "min_batch": sv.want_opt_int("min_batch", d.get("min_batch")),
            "accumulation": sv.want_opt_int("accumulation", d.get("accumulation")),
            "fit_batch": sv.want_bool("fit_batch", d.get("fit_batch", True)),
            "rlimits": sv.want_rlimits("rlimits", d.get("rlimits", {})),
        }
        return cls(**values)


def _options_from_json(d: Any) -> MemoryOptions:
    if not isinstance(d, Mapping):
        raise sv.bad("options", "an object", d)
    known = {f.name for f in fields(MemoryOptions)}
    for key in d:
        if key not in known:
            raise SpecError(f"job spec: unknown field 'options.{key}'")
    return MemoryOptions(
        gpus=sv.want_gpus("options.gpus", d.get("gpus")),
        cpu_only=sv.want_bool("options.cpu_only", d.get("cpu_only", False)),
        memory_growth=sv.want_opt_bool("options.memory_growth", d.get("memory_growth")),
        vram_limit_mb=sv.want_opt_int("options.vram_limit_mb", d.get("vram_limit_mb")),
        vram_reserve_mb=sv.want_opt_int("options.vram_reserve_mb", d.get("vram_reserve_mb")),
        allocator=sv.want_opt_str("options.allocator", d.get("allocator")),
        precision=sv.want_opt_str("options.precision", d.get("precision")),
        xla=sv.want_opt_bool("options.xla", d.get("xla")),
        intra_threads=sv.want_opt_int("options.intra_threads", d.get("intra_threads")),
        inter_threads=sv.want_opt_int("options.inter_threads", d.get("inter_threads")),
    )
