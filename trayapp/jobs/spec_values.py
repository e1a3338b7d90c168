"""The values of a job spec as people type them, read once for ``headroom run`` and the dialog.

``SpecError`` is the refusal of a spec: one line for the user, and the spec field it is about
(``field``, the name in ``JobSpec.to_json``: ``"ram_budget_mb"``, ``"options.vram_limit_mb"``),
so a form marks the right row without reading the message. The parsers here are the one rule for
each kind of value: sizes (``parse_mb``), whole numbers, GPU lists, thread counts, ``KEY=VALUE``
entries and the script's arguments; ``add_run_arguments`` defines the ``headroom run``
flags they read. The JSON type checks of ``JobSpec.from_json`` are here too.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from trayapp.config import ConfigError, parse_size
from trayapp.errors import Refused
from trayapp.runner import tfoptions
from trayapp.text import one_line

MIB = 1024 * 1024
ALLOCATORS = ("bfc", "cuda_malloc_async")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")

PRESETS: Dict[str, str] = {
    "desktop-safe": (
        "memory growth; when one of the job's GPUs drives a display, instead 1024 MiB left free "
        "on each of the job's GPUs and no growth (TensorFlow cannot combine growth with a "
        "limit on a GPU, and one choice holds for all of a job's GPUs); a RAM budget of 75% of "
        "RAM"
    ),
    "throughput": (
        "no memory growth, the cuda_malloc_async allocator, mixed_float16 where every GPU has "
        "compute capability 7.0 or newer, XLA on"
    ),
    "cpu-only": "no GPU: CUDA_VISIBLE_DEVICES=-1",
}

# Spec fields (JobSpec.to_json's names), for SpecError.field.
SCRIPT = "script"
ARGS = "args"
PYTHON = "python"
NAME = "name"
CWD = "cwd"
ENV = "env"
GPUS = "options.gpus"
CPU_ONLY = "options.cpu_only"
MEMORY_GROWTH = "options.memory_growth"
VRAM_LIMIT = "options.vram_limit_mb"
VRAM_RESERVE = "options.vram_reserve_mb"
ALLOCATOR = "options.allocator"
PRECISION = "options.precision"
XLA = "options.xla"
THREADS = "options.intra_threads"
RAM_BUDGET = "ram_budget_mb"
VRAM_BUDGET = "vram_budget_mb"
CHECKPOINT_DIR = "checkpoint_dir"
CHECKPOINT_EVERY = "checkpoint_every_steps"
RESUME = "resume"
FRESH = "fresh"
PRESET = "preset"
AUTO_RESUME = "auto_resume"
ON_OOM = "on_oom"
MIN_BATCH = "min_batch"
# The runner's words (trayapp.runner.tfoptions): it reads them in the job's own Python.
ON_OOM_SHRINK = tfoptions.ON_OOM_SHRINK
ON_OOM_SMALLER_BATCH = tfoptions.ON_OOM_SMALLER_BATCH
ON_OOM_CHOICES = tfoptions.ON_OOM
ON_OOM_SHRINKS = tfoptions.ON_OOM_SHRINKS
MIN_BATCH_DEFAULT = tfoptions.MIN_BATCH


class SpecError(Refused):
    """A job spec that cannot run; the message is one line naming the flag or field (a value
    quoted in it shows its control characters as escapes). ``field``: the spec field it is
    about (one of this module's field names), or None when it is about no one field."""

    def __init__(self, message: str, field: Optional[str] = None) -> None:
        super().__init__(one_line(message))
        self.field = field


# ---------------------------------------------------------------------------------------------
# What people type (``headroom run`` flags, the launch dialog's fields)


def parse_mb(flag: str, value: Any, field: Optional[str] = None) -> Optional[int]:
    """A size in MB: a whole number is MB as given (``4096``; ``0`` or less is left to
    ``options.validate``, which refuses it naming the flag), a size with a unit is converted
    (``"12 GiB"`` -> 12288) and must come to 1 MB or more; None or blank text is no size (None).
    Raises SpecError naming ``flag`` for text that is not a size, or a size under 1 MB."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise SpecError(f"{flag}: {value!r} is not a size in MiB", field)
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        mb = parse_size(text) // MIB
    except ConfigError:
        raise SpecError(
            f"{flag}: {text!r} is not a size (like 4096 for MiB, or 4 GiB)", field
        ) from None
    if mb <= 0:
        raise SpecError(f"{flag}: {text!r} is less than 1 MiB", field)
    return mb


def parse_int(flag: str, value: Any, what: str, field: Optional[str] = None) -> Optional[int]:
    """A whole number (None stays None); raises SpecError naming ``flag`` and ``what``."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise SpecError(f"{flag}: {value!r} is not {what}", field) from None


def parse_gpus(value: Any) -> Optional[Tuple[int, ...]]:
    """GPU numbers, ``"0,1"`` or a list (None stays None); raises SpecError."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        parts = [str(v) for v in value]
    else:
        parts = [p.strip() for p in str(value).split(",")]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise SpecError(f"--gpu: expected GPU numbers like 0 or 0,1, not {value!r}", GPUS) from None


def parse_threads(value: Any) -> Tuple[Optional[int], Optional[int]]:
    """``"INTRA"`` or ``"INTRA,INTER"`` -> (intra, inter); None -> (None, None)."""
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
    raise SpecError(
        f"--threads: expected INTRA or INTRA,INTER (whole numbers), not {value!r}", THREADS
    )


def parse_env_entry(entry: str) -> Tuple[str, str]:
    """``KEY=VALUE`` -> (KEY, VALUE): the key without the spaces around it, the value as typed
    after the first ``=``. Raises SpecError for an entry without ``=`` or without a key."""
    key, sep, value = str(entry).partition("=")
    if not sep or not key.strip():
        raise SpecError(f"--env: {entry!r} is not KEY=VALUE", ENV)
    return key.strip(), value


def parse_env(entries: Iterable[str]) -> Tuple[Tuple[str, str], ...]:
    """``--env`` entries, each one ``KEY=VALUE`` (``parse_env_entry``)."""
    return tuple(parse_env_entry(entry) for entry in entries or ())


def parse_env_lines(text: str) -> Tuple[Tuple[str, str], ...]:
    """``KEY=VALUE`` lines (blank lines and ``#`` comments skipped, each line stripped), each
    read by ``parse_env_entry``."""
    lines = (line.strip() for line in text.splitlines())
    return parse_env(line for line in lines if line and not line.startswith("#"))


def split_args(text: str) -> Tuple[str, ...]:
    """The script's arguments as typed (shell-like quoting). Raises SpecError."""
    try:
        return tuple(shlex.split(text, posix=True))
    except ValueError as e:
        raise SpecError(f"arguments: {e} (close the quote)", ARGS) from None


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
    add_env_argument(g)
    add_option_arguments(parser)
    parser.add_argument("--dry-run", action="store_true", help="print the launch plan and exit")
    parser.add_argument("script", metavar="SCRIPT", help="the training script")
    parser.add_argument(
        "script_args", metavar="SCRIPT_ARGS", nargs=argparse.REMAINDER, help="the script's own"
    )


def add_env_argument(group: Any) -> None:
    """The repeatable ``--env KEY=VALUE`` flag."""
    group.add_argument(
        "--env",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="an environment variable for the job (repeatable)",
    )


def add_option_arguments(parser: argparse.ArgumentParser, resume: bool = True) -> None:
    """The memory options, presets, budgets, checkpoints and out-of-memory flags of ``headroom
    run`` (``headroom kernel install`` has them too; ``resume``: with --resume and --fresh)."""
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
    vram.add_argument("--vram-limit", metavar="MiB", help="hard cap of GPU memory per GPU")
    vram.add_argument("--vram-reserve", metavar="MiB", help="leave this much free on each GPU")
    m.add_argument("--allocator", choices=ALLOCATORS, help="TensorFlow's GPU allocator")
    m.add_argument("--precision", choices=PRECISIONS, help="Keras's global dtype policy")
    m.add_argument(
        "--xla", action=argparse.BooleanOptionalAction, default=None, help="XLA auto-clustering"
    )
    m.add_argument("--threads", metavar="INTRA[,INTER]", help="TensorFlow's CPU thread pools")
    m.add_argument("--preset", choices=tuple(PRESETS), help="desktop-safe | throughput | cpu-only")
    b = parser.add_argument_group("guard and checkpoints")
    b.add_argument("--ram-budget", metavar="MiB", help="RAM budget of this job for the guard")
    b.add_argument("--vram-budget", metavar="MiB", help="VRAM budget of this job for the guard")
    b.add_argument("--checkpoint-dir", metavar="DIR", help="keep training progress here")
    b.add_argument(
        "--checkpoint-every",
        metavar="STEPS",
        help="checkpoint every STEPS batches (default: every epoch)",
    )
    if resume:
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
    s = parser.add_argument_group("when the training does not fit")
    s.add_argument(
        "--on-oom",
        choices=ON_OOM_CHOICES,
        help="an out-of-memory error in fit(): train micro-batches with gradient accumulation, "
        "the same training (shrink, the default; Keras 3); the same, or with Keras 2 a smaller "
        "batch, which changes the training (smaller-batch); or fail (stop)",
    )
    s.add_argument(
        "--min-batch",
        metavar="N",
        help=f"the smallest micro-batch shrinking goes down to (default "
        f"{MIN_BATCH_DEFAULT}); below it the job parks",
    )
    s.add_argument(
        "--fit-batch",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="before the first full step, measure a few small steps and train the "
        "largest micro-batch forecast to fit (the same training, Keras 3); on by "
        "default, --no-fit-batch starts at the full batch",
    )


# ---------------------------------------------------------------------------------------------
# JSON type checks (JobSpec.from_json)


def bad(name: str, what: str, value: Any) -> SpecError:
    """The refusal of JSON field ``name`` for not being ``what``."""
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return SpecError(f"job spec: {name} must be {what}, not {shown}", name)


def want_str(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise bad(name, "a string", v)
    return v


def want_opt_str(name: str, v: Any) -> Optional[str]:
    return None if v is None else want_str(name, v)


def want_bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise bad(name, "true or false", v)
    return v


def want_opt_bool(name: str, v: Any) -> Optional[bool]:
    return None if v is None else want_bool(name, v)


def want_opt_int(name: str, v: Any) -> Optional[int]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(name, "a whole number or null", v)
    return v


def want_str_list(name: str, v: Any) -> List[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise bad(name, "a list of strings", v)
    return v


def want_env(name: str, v: Any) -> Tuple[Tuple[str, str], ...]:
    if isinstance(v, Mapping):
        items = list(v.items())
    elif isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 for p in v):
        items = [(p[0], p[1]) for p in v]
    else:
        raise bad(name, "a list of [KEY, VALUE] pairs", v)
    if not all(isinstance(k, str) and isinstance(x, str) for k, x in items):
        raise bad(name, "a list of [KEY, VALUE] string pairs", v)
    return tuple(items)


# The resource limits ``headroom run`` hands its job (``resource.RLIMIT_*`` without the prefix):
# the caller's, whoever started the engine (the job is the engine's child).
RLIMITS = ("AS", "DATA", "RSS", "NOFILE", "NPROC", "STACK", "CORE", "CPU")
RLIMIT_MAX = 2**63  # beyond any real limit; None is "unlimited"


def own_rlimits() -> Tuple[Tuple[str, Optional[int], Optional[int]], ...]:
    """This process's resource limits (``RLIMITS``) as a job spec holds them, None for
    unlimited; () where there are none (Windows)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return ()
    out = []
    for name in RLIMITS:
        which = getattr(resource, f"RLIMIT_{name}", None)
        if which is not None:
            out.append(
                (
                    name,
                    *(
                        None if v == resource.RLIM_INFINITY else v
                        for v in resource.getrlimit(which)
                    ),
                )
            )
    return tuple(sorted(out))  # type: ignore[arg-type]


def want_rlimits(name: str, v: Any) -> Tuple[Tuple[str, Optional[int], Optional[int]], ...]:
    """``{"AS": [soft, hard], ...}`` (None: unlimited) -> sorted (name, soft, hard) tuples.
    Refuses an unknown name, a value that is not a whole number in range, a soft limit above
    its hard one."""
    if not isinstance(v, Mapping):
        raise bad(name, "an object of {LIMIT: [soft, hard]}", v)
    out = []
    for key, pair in v.items():
        if key not in RLIMITS:
            raise SpecError(
                f"job spec: {name}: unknown limit {str(key)[:20]!r} (one of {', '.join(RLIMITS)})",
                name,
            )
        if not isinstance(pair, list) or len(pair) != 2:
            raise bad(f"{name}.{key}", "a [soft, hard] pair", pair)
        soft, hard = (want_opt_int(f"{name}.{key}", x) for x in pair)
        for x in (soft, hard):
            if x is not None and not 0 <= x < RLIMIT_MAX:
                raise bad(f"{name}.{key}", f"between 0 and {RLIMIT_MAX} or null", x)
        if hard is not None and (soft is None or soft > hard):
            raise SpecError(f"job spec: {name}.{key}: the soft limit is above the hard one", name)
        out.append((key, soft, hard))
    return tuple(sorted(out))


def want_gpus(name: str, v: Any) -> Optional[Tuple[int, ...]]:
    if v is None:
        return None
    if not isinstance(v, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in v
    ):
        raise bad(name, "a list of GPU numbers or null", v)
    return tuple(v)
