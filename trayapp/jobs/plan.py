"""A job spec as a launch plan: the command, the environment and the folder. Pure: it starts
nothing, so ``headroom run --dry-run`` and the tests see exactly what a launch would do.

The job runs ``<python> <runner>/bootstrap.py <script> <args...>``. The runner is a folder of
plain ``.py`` files (``trayapp/runner``; in a frozen build ``<bundle>/trayapp/runner``, shipped as
data) that the job's own Python loads without anything of Headroom on its path.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import trayapp.runner
from trayapp.formats import format_bytes
from trayapp.jobs import interpreters
from trayapp.jobs import spec_values as sv
from trayapp.jobs.interpreters import REMOVED
from trayapp.jobs.options import (
    JobSpec,
    SpecError,
    apply_preset,
    env_warnings,
    resolve_python,
    script_path,
    total_mb,
    validate,
)
from trayapp.jobs.plan_text import fit_batch_line, guard_lines, oom_line, runner_steps
from trayapp.jsonvalue import JSONObject
from trayapp.readings import GpuReading
from trayapp.runner import joblog, protocol

__all__ = [
    "JobProcess",
    "LaunchPlan",
    "REMOVED",
    "build_launch",
    "default_runner_dir",
    "format_plan",
    "guard_lines",
    "runner_steps",
]

MiB = 1024 * 1024
WINDOWS = sys.platform == "win32"


@dataclass(frozen=True)
class JobProcess:
    """How the job's process runs beside the desktop (the ``[jobs]`` settings): its nice value
    (0 is the desktop's normal priority; never below it), its ``oom_score_adj`` (raised, so a
    kernel that must kill takes the training, which a checkpoint brings back, and not the
    desktop), and its log's cap. The runner applies them before the script's code; on Windows
    a nice value above 0 is the BELOW_NORMAL priority class, and there is no OOM score."""

    nice: int = 0
    oom_score_adj: int = 500
    log_max_bytes: int = 32 * MiB
    # The resource limits the job is given (JobSpec.rlimits: its caller's), and those of the
    # engine that launches it where they are known (--dry-run says which differ).
    rlimits: Tuple[Tuple[str, Optional[int], Optional[int]], ...] = ()
    engine_rlimits: Optional[Mapping[str, Any]] = None

    @classmethod
    def from_config(cls, config: Any) -> JobProcess:
        """From a ``Config`` (or anything with ``config["jobs.nice"]``); defaults where a
        value is missing."""

        def get(name: str, default: int) -> int:
            try:
                return int(config[name])
            except (KeyError, TypeError, ValueError):
                return default

        return cls(
            nice=get("jobs.nice", 0),
            oom_score_adj=get("jobs.oom_score_adj", 500),
            log_max_bytes=get("jobs.log_max_mb", 32) * MiB,
        )

    def to_json(self, log_path: str = "") -> JSONObject:
        """What the runner reads (``protocol.ENV_PROCESS``)."""
        out: JSONObject = {"nice": self.nice, "log_max_bytes": self.log_max_bytes}
        if not WINDOWS:
            out["oom_score_adj"] = self.oom_score_adj
        if log_path:
            out["log"] = log_path
        if self.rlimits:
            out["rlimits"] = {name: [soft, hard] for name, soft, hard in self.rlimits}
        return out


def process_lines(process: JobProcess, platform: str = sys.platform) -> List[str]:
    """The job's process settings in words (``--dry-run``, the jobs window)."""
    if platform == "win32":
        cpu = (
            f"CPU priority: below normal (nice {process.nice}: the BELOW_NORMAL priority class)"
            if process.nice > 0
            else "CPU priority: normal (the desktop's; the engine's own is not passed on)"
        )
        oom = "OOM killer: no OOM score on Windows"
    else:
        cpu = (
            f"CPU priority: nice {process.nice} (0 is the desktop's normal priority; the "
            "engine's own nice -5 is not passed on)"
        )
        oom = (
            f"OOM killer: oom_score_adj {process.oom_score_adj:+d} (the desktop's is 0: a "
            "kernel that must kill takes the training, which a checkpoint brings back)"
        )
    cap = process.log_max_bytes
    if platform == "win32":
        logline = f"Log: not capped on Windows (jobs.log_max_mb = {cap // MiB})"
    else:
        logline = (
            f"Log: capped at {cap / MiB:.1f} MiB (its first "
            f"{joblog.head_bytes(cap) / MiB:.1f} MiB and its last "
            f"{joblog.tail_bytes(cap) / MiB:.1f} MiB kept)"
        )
    return [cpu, oom, logline, *rlimit_lines(process)]


def rlimit_text(value: Optional[int], name: str) -> str:
    """One limit as a person reads it: sizes in bytes' units, CPU in seconds, counts."""
    if value is None:
        return "unlimited"
    if name in ("NOFILE", "NPROC"):
        return str(value)
    if name == "CPU":
        return f"{value} s"
    return format_bytes(value)


def rlimit_lines(process: JobProcess) -> List[str]:
    """The limits the job gets that differ from the engine's (all of its finite ones when the
    engine's are not known): ``"Limit AS: 2.5 GiB soft, 2.5 GiB hard, from the shell
    that ran headroom run (the engine's: unlimited)"``."""
    engine = process.engine_rlimits
    out = []
    for name, soft, hard in process.rlimits:
        theirs = engine.get(name) if engine is not None else None
        if engine is not None and isinstance(theirs, list) and list(theirs) == [soft, hard]:
            continue
        if engine is None and soft is None and hard is None:
            continue
        line = (
            f"Limit {name}: {rlimit_text(soft, name)} soft, {rlimit_text(hard, name)} "
            "hard, from the shell that ran headroom run"
        )
        if isinstance(theirs, list) and len(theirs) == 2:
            line += f" (the engine's: {rlimit_text(theirs[0], name)})"
        out.append(line)
    return out


@dataclass(frozen=True)
class LaunchPlan:
    argv: Tuple[str, ...]
    env: Dict[str, str]  # the full environment the job gets
    cwd: str
    # Each variable Headroom sets or removes: (name, value or REMOVED, reason in plain words).
    settings: Tuple[Tuple[str, str, str], ...]
    runner_options: Dict[str, Any]  # what the runner applies inside TensorFlow (JSON)
    warnings: Tuple[str, ...] = field(default=())
    process: JobProcess = field(default=JobProcess())


def default_runner_dir() -> Path:
    """The folder holding ``bootstrap.py`` (inside the app bundle in a frozen build)."""
    if getattr(sys, "frozen", False):
        bundle = getattr(sys, "_MEIPASS", None) or os.path.dirname(sys.executable)
        return Path(bundle) / "trayapp" / "runner"
    return Path(os.path.abspath(trayapp.runner.__file__)).parent


def _visible_readings(
    spec: JobSpec, gpus: Sequence[GpuReading], env: Mapping[str, str]
) -> Optional[List[GpuReading]]:
    """NVML's readings of the GPUs TensorFlow will number GPU:0, GPU:1, ... (None if unknown)."""
    o = spec.options
    if o.gpus is not None:
        by_index = {g.index: g for g in gpus}
        return [by_index[i] for i in o.gpus if i in by_index]
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(gpus)
    out = []
    for item in (x.strip() for x in visible.split(",")):
        if not item:
            continue
        if item.isdigit():
            match = [g for g in gpus if g.index == int(item)]
        else:
            match = [g for g in gpus if g.uuid and g.uuid.startswith(item)]
        if len(match) != 1:
            return None
        out.append(match[0])
    return out


def _runner_options(
    spec: JobSpec, gpus: Sequence[GpuReading], env: Mapping[str, str]
) -> Dict[str, Any]:
    o = spec.options
    limit: Any = None
    vram_option = None
    if not o.cpu_only and o.vram_limit_mb is not None:
        limit, vram_option = o.vram_limit_mb, "--vram-limit"
    elif not o.cpu_only and o.vram_reserve_mb is not None:
        vram_option = "--vram-reserve"
        visible = _visible_readings(spec, gpus, env)
        if visible is None or any(total_mb(g) is None for g in visible):
            raise SpecError(
                "--vram-reserve: cannot tell the total memory of each GPU the job sees; "
                "use --gpu or --vram-limit MiB",
                field="options.vram_reserve_mb",
            )
        if not visible:
            raise SpecError(
                "--vram-reserve: the GPUs' total memory is unknown (no NVML reading); "
                "use --vram-limit MiB",
                field="options.vram_reserve_mb",
            )
        limit = [int(total_mb(g) or 0) - o.vram_reserve_mb for g in visible]
    return {
        "memory_growth": None if o.cpu_only else o.memory_growth,
        "vram_limit_mb": limit,
        "vram_option": vram_option,
        "precision": o.precision,
        "xla": o.xla,
        "intra_threads": o.intra_threads,
        "inter_threads": o.inter_threads,
        "checkpoint_dir": os.path.abspath(spec.checkpoint_dir) if spec.checkpoint_dir else None,
        "checkpoint_every_steps": spec.checkpoint_every_steps,
        "resume": spec.resume,
        "on_oom": spec.on_oom,
        "min_batch": spec.min_batch or sv.MIN_BATCH_DEFAULT,
        "accumulation": spec.accumulation or 1,
        "fit_batch": spec.fit_batch,
    }


class _Env:
    """The job's environment being built, with each variable Headroom sets or removes and why
    (the latest word on a name last)."""

    def __init__(self, env: Dict[str, str], settings: Sequence[Tuple[str, str, str]]):
        self.env = env
        self.settings: Dict[str, Tuple[str, str]] = {
            name: (value, why) for name, value, why in settings
        }

    def set(self, name: str, value: str, why: str) -> None:
        self.env[name] = value
        self.settings.pop(name, None)
        self.settings[name] = (value, why)

    def remove(self, name: str, why: str) -> None:
        if name in self.env:
            del self.env[name]
            self.settings.pop(name, None)
            self.settings[name] = (REMOVED, why)


def build_launch(
    spec: JobSpec,
    *,
    job_id: str = "dry-run",
    address: str = "",
    keyfile: str = "",
    gpus: Sequence[GpuReading] = (),
    base_env: Optional[Mapping[str, str]] = None,
    runner_dir: Optional[Path] = None,
    frozen: Optional[bool] = None,
    bundle_dir: Optional[str] = None,
    process: Optional[JobProcess] = None,
    log_path: str = "",
) -> LaunchPlan:
    """The launch plan of ``spec``; starts nothing. Raises SpecError for a spec that cannot run.

    ``gpus``: NVML's readings at launch (a reserve becomes "total - reserve" from them).
    ``base_env``: the environment to start from (default ``os.environ``). ``address``/``keyfile``:
    the job channel; without an address the job runs without one. The preset, if any, is applied
    (it is idempotent; the launcher may have applied it already with the RAM total).
    ``frozen``/``bundle_dir`` default to what this process is (tests pass them).
    ``process``: priority, OOM score and log cap (default: the settings' defaults);
    ``log_path``: the job's log, which the runner keeps under its cap.
    """
    if spec.preset:
        spec = apply_preset(spec, spec.preset, gpus)
    warnings = list(validate(spec, gpus, check_paths=False))
    script = script_path(spec)
    python = resolve_python(spec.python) if spec.python else interpreters.default_python(script)
    cwd = os.path.abspath(spec.cwd) if spec.cwd else os.path.dirname(script)
    runner = Path(runner_dir) if runner_dir is not None else default_runner_dir()
    argv = (python, str(runner / "bootstrap.py"), script) + tuple(spec.args)

    base = _base_environment(base_env, spec, warnings)
    env, settings_list = interpreters.job_environment(
        python, base, frozen=frozen, bundle_dir=bundle_dir
    )
    e = _Env(env, settings_list)
    _gpu_settings(e, spec, gpus)
    _memory_settings(e, spec)
    e.set("PYTHONUNBUFFERED", "1", "the log shows the script's output as it happens")
    runner_options = _runner_options(spec, gpus, env)
    process = process if process is not None else JobProcess()
    if spec.rlimits:
        process = dataclasses.replace(process, rlimits=spec.rlimits)
    _runner_settings(
        e,
        runner_options,
        process,
        job_id=job_id,
        address=address,
        keyfile=keyfile,
        log_path=log_path,
    )
    environment_changes = {name for name, _, _ in settings_list}
    for name, value in spec.env:
        if name in e.settings and e.settings[name][0] != value and name not in environment_changes:
            # The name only: warnings are kept with the job, and --env values never are.
            warnings.append(f"--env {name} replaces Headroom's {name}={e.settings[name][0]}")
        e.set(name, value, "--env")

    return LaunchPlan(
        argv=argv,
        env=env,
        cwd=cwd,
        settings=tuple((name, value, why) for name, (value, why) in e.settings.items()),
        runner_options=runner_options,
        warnings=tuple(warnings),
        process=process,
    )


def _base_environment(
    base_env: Optional[Mapping[str, str]], spec: JobSpec, warnings: List[str]
) -> Dict[str, str]:
    """The environment the job starts from, without another job's channel; what in it the
    job ignores is added to ``warnings``."""
    base = dict(os.environ if base_env is None else base_env)
    for name in list(base):
        if name.startswith("HEADROOM_JOB_"):
            del base[name]  # a job started from inside another job gets its own channel
    # Only the ignored variables: a conflicting TF_FORCE_GPU_ALLOW_GROWTH is replaced later.
    for warning in env_warnings(base, spec, source="the environment", growth=False):
        if warning not in warnings:
            warnings.append(warning)
    return base


def _gpu_settings(e: _Env, spec: JobSpec, gpus: Sequence[GpuReading]) -> None:
    """Which GPUs TensorFlow sees, numbered as NVML numbers them."""
    o = spec.options
    if o.cpu_only:
        e.set("CUDA_VISIBLE_DEVICES", "-1", "--cpu-only: TensorFlow sees no GPU")
    elif o.gpus is not None:
        numbers = ",".join(str(i) for i in o.gpus)
        e.set(
            "CUDA_DEVICE_ORDER",
            "PCI_BUS_ID",
            "number GPUs as nvidia-smi and Headroom do (CUDA's default order differs)",
        )
        e.set(
            "CUDA_VISIBLE_DEVICES",
            numbers,
            f"--gpu {numbers}: TensorFlow sees only these, as GPU:0"
            + (", GPU:1, ..." if len(o.gpus) > 1 else ""),
        )
    elif o.vram_reserve_mb is not None and len(gpus) > 1 and "CUDA_DEVICE_ORDER" not in e.env:
        e.set(
            "CUDA_DEVICE_ORDER",
            "PCI_BUS_ID",
            "number GPUs as NVML does, so each gets the reserve of its own total",
        )


def _memory_settings(e: _Env, spec: JobSpec) -> None:
    """Memory growth (the variable; the runner also calls set_memory_growth) and the
    allocator."""
    o = spec.options
    if o.cpu_only:
        return
    has_limit = o.vram_limit_mb is not None or o.vram_reserve_mb is not None
    if o.memory_growth is True:
        e.set(
            "TF_FORCE_GPU_ALLOW_GROWTH",
            "true",
            "memory growth: TensorFlow takes GPU memory as it needs it, not all at start",
        )
    elif o.memory_growth is False:
        e.set(
            "TF_FORCE_GPU_ALLOW_GROWTH",
            "false",
            "--no-memory-growth: TensorFlow reserves the GPU's memory at start",
        )
    elif has_limit and "TF_FORCE_GPU_ALLOW_GROWTH" in e.env:
        e.remove(
            "TF_FORCE_GPU_ALLOW_GROWTH",
            "memory growth cannot be combined with a VRAM limit on one GPU",
        )
    if o.allocator == "cuda_malloc_async":
        e.set(
            "TF_GPU_ALLOCATOR",
            "cuda_malloc_async",
            "CUDA's stream-ordered allocator: less fragmentation, memory returned to CUDA",
        )
    elif o.allocator == "bfc":
        e.remove("TF_GPU_ALLOCATOR", "--allocator bfc: TensorFlow's default allocator")


def _runner_settings(
    e: _Env,
    runner_options: Dict[str, Any],
    process: JobProcess,
    *,
    job_id: str,
    address: str,
    keyfile: str,
    log_path: str,
) -> None:
    """What the runner inside the job reads: its id, channel, options and process settings."""
    e.set(protocol.ENV_JOB_ID, job_id, "the job's id, for the runner's messages")
    if address:
        e.set(protocol.ENV_ADDRESS, address, "where the runner reports progress and takes commands")
    if keyfile:
        e.set(
            protocol.ENV_KEYFILE,
            keyfile,
            "the job channel's key (the runner removes this variable before the script runs)",
        )
    e.set(
        protocol.ENV_OPTIONS,
        json.dumps(runner_options, sort_keys=True, separators=(",", ":")),
        "what the runner applies inside TensorFlow before the script's code",
    )
    e.set(
        protocol.ENV_PROCESS,
        json.dumps(process.to_json(log_path), sort_keys=True, separators=(",", ":")),
        "the job's CPU priority, OOM score and log cap, which the runner sets before the "
        "script's code",
    )


def format_plan(plan: LaunchPlan, guard: Sequence[str] = ()) -> str:
    """The plan for ``headroom run --dry-run``: command, folder, variables, runner steps, what
    the guard does (``guard``: from ``guard_lines``), warnings."""
    lines = ["Command:", "  " + " ".join(shlex.quote(a) for a in plan.argv), "", "Folder:"]
    lines.append("  " + plan.cwd)
    lines += ["", "Environment set by Headroom:"]
    for name, value, why in plan.settings:
        lines.append(f"  unset {name}" if value == REMOVED else f"  {name}={shlex.quote(value)}")
        lines.append(f"      # {why}")
    lines += ["", "Process:"]
    lines += [f"  {line}" for line in process_lines(plan.process)]
    lines += ["", "Inside TensorFlow, before the script's code:"]
    steps = runner_steps(plan.runner_options)
    if steps:
        for what, call in steps:
            lines.append(f"  {what}")
            lines.append(f"    {call}")
    else:
        lines.append("  nothing (TensorFlow's defaults)")
    lines += ["", "Out of memory in fit():", "  " + oom_line(plan.runner_options)]
    fitting = fit_batch_line(plan.runner_options)
    if fitting:
        lines.append("  " + fitting)
    if guard:
        lines += ["", "The guard:"]
        lines += [f"  {line}" for line in guard]
    if plan.warnings:
        lines += ["", "Warnings:"]
        lines += [f"  ! {w}" for w in plan.warnings]
    return "\n".join(lines) + "\n"
