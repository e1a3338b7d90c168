"""A Jupyter kernel spec whose kernel is a guarded job: ``headroom kernel install`` and the launch
dialog's "Install as a Jupyter kernel". No Qt, and nothing of Jupyter is imported: the folders
are found the way ``jupyter_core`` finds them, and the target interpreter needs ``ipykernel``,
Headroom does not.

``kernel_json`` builds the ``kernel.json`` dict from a ``JobSpec`` (the spec ``headroom run``
reads from the same flags, with no script): Jupyter starts
``PYTHON <runner>/bootstrap.py --kernel -f {connection_file}``, and the runner applies the options
(``HEADROOM_JOB_OPTIONS``, made by ``plan.build_launch``, the code that plans ``headroom run``)
before ``ipykernel`` runs a cell, then registers the kernel with the engine as a job
(``HEADROOM_KERNEL``: the engine-side spec, as ``headroom run`` sends it, with no script).
The environment variables the plan sets for the memory options (``CUDA_VISIBLE_DEVICES``,
``TF_FORCE_GPU_ALLOW_GROWTH``, ``TF_GPU_ALLOCATOR``...) and the ``--env`` entries are in the
spec's ``env`` too; Jupyter adds them to the kernel's environment. What the user asked for
(``spec_flags``) is kept in ``metadata.headroom`` for ``headroom kernel list``.

Files: ``install`` writes ``<folder>/<name>/kernel.json`` through a temporary file (a crash
leaves the old spec), user-only in the user's Jupyter folder. ``list_kernels`` and ``remove``
look in the folders Jupyter searches; ``remove`` touches Headroom's specs only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import stat
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from trayapp.config import atomic_write
from trayapp.jobs import interpreters
from trayapp.jobs import spec_values as sv
from trayapp.jobs.interpreters import REMOVED
from trayapp.jobs.jupyter_paths import IPYKERNEL_TIMEOUT_S as IPYKERNEL_TIMEOUT_S
from trayapp.jobs.jupyter_paths import KernelSpecError as KernelSpecError
from trayapp.jobs.jupyter_paths import ipykernel_problem as ipykernel_problem
from trayapp.jobs.jupyter_paths import jupyter_data_dir as jupyter_data_dir
from trayapp.jobs.jupyter_paths import prefix_kernels_dir as prefix_kernels_dir
from trayapp.jobs.jupyter_paths import python_prefix as python_prefix
from trayapp.jobs.jupyter_paths import search_dirs as search_dirs
from trayapp.jobs.jupyter_paths import user_kernels_dir as user_kernels_dir
from trayapp.jobs.options import (
    JobSpec,
    SpecError,
    _check_writable,
    apply_preset,
    check_python,
    resolve_python,
    spec_from_cli,
    validate,
)
from trayapp.jobs.plan import JobProcess, build_launch, default_runner_dir
from trayapp.jsonvalue import JSONObject
from trayapp.readings import GpuReading
from trayapp.runner import protocol

KERNEL_ENV = "HEADROOM_KERNEL"  # JSON: {"v", "name", "spec"}, for the engine's adoption
HOME_ENV = "HEADROOM_HOME"
SPEC_VERSION = 1
SPEC_FILE = "kernel.json"
# Jupyter's rule for a kernel name (jupyter_client.kernelspec._kernel_name_pat); Jupyter folds
# names to lower case.
_NAME = re.compile(r"^[a-z0-9._\-]+$", re.IGNORECASE)
MAX_SPEC_BYTES = 1 << 20  # a kernel.json larger than this is not one Headroom wrote
# Spec fields the kernel does not take from its spec: Jupyter starts it, in the notebook's
# folder, with no script; --env values go to the kernel's environment only (never to the engine).
_NOT_FOR_THE_ENGINE = ("script", "args", "cwd", "env")


# ---------------------------------------------------------------------------------------------
# Names and what the spec says


def default_name(preset: Optional[str]) -> str:
    """``headroom-desktop-safe`` for a preset, else ``headroom``."""
    return f"headroom-{preset}" if preset else "headroom"


def default_display_name(preset: Optional[str]) -> str:
    """What Jupyter lists: ``Python 3 (Headroom: desktop-safe)``, or ``... custom)``."""
    return f"Python 3 (Headroom: {preset or 'custom'})"


def check_name(name: str) -> str:
    """The kernel name as Jupyter keeps it (lower case); raises KernelSpecError for one Jupyter
    would not list."""
    if not _NAME.match(name or ""):
        raise KernelSpecError(
            f"--name: {name!r} is not a kernel name (letters, digits, '.', '_' and '-' only)"
        )
    return name.lower()


def spec_flags(spec: JobSpec) -> List[str]:
    """The ``headroom kernel install`` flags that give ``spec`` (as the user set it, before a
    preset fills the rest): what ``kernel list`` shows. --env values are shown as ``KEY=...``."""
    o = spec.options
    out: List[str] = []
    if spec.preset:
        out += ["--preset", spec.preset]
    if o.cpu_only:
        out.append("--cpu-only")
    if o.gpus is not None:
        out += ["--gpu", ",".join(str(i) for i in o.gpus)]
    if o.memory_growth is not None:
        out.append("--memory-growth" if o.memory_growth else "--no-memory-growth")
    for flag, value in (
        ("--vram-limit", o.vram_limit_mb),
        ("--vram-reserve", o.vram_reserve_mb),
        ("--allocator", o.allocator),
        ("--precision", o.precision),
    ):
        if value is not None:
            out += [flag, str(value)]
    if o.xla is not None:
        out.append("--xla" if o.xla else "--no-xla")
    if o.intra_threads is not None:
        threads = str(o.intra_threads)
        if o.inter_threads is not None:
            threads += f",{o.inter_threads}"
        out += ["--threads", threads]
    for flag, value in (
        ("--ram-budget", spec.ram_budget_mb),
        ("--vram-budget", spec.vram_budget_mb),
        ("--checkpoint-dir", spec.checkpoint_dir),
        ("--checkpoint-every", spec.checkpoint_every_steps),
        ("--min-batch", spec.min_batch),
    ):
        if value is not None:
            out += [flag, str(value)]
    if spec.auto_resume is False:
        out.append("--manual-resume")
    if spec.on_oom != sv.ON_OOM_SHRINK:
        out += ["--on-oom", spec.on_oom]
    if not spec.fit_batch:
        out.append("--no-fit-batch")  # on by default
    for key, _ in spec.env:
        out += ["--env", f"{key}=..."]
    return out


def kernel_python(python: Optional[str], cwd: Optional[str] = None) -> str:
    """The kernel's interpreter: ``python`` (a bare name looked up on PATH) as an absolute path
    (a venv's ``python`` link is kept, not resolved: it makes the venv), else what ``headroom
    run`` would take for a script in ``cwd``. Raises SpecError."""
    folder = cwd or os.getcwd()
    if python:
        return os.path.abspath(os.path.join(folder, resolve_python(python)))
    return interpreters.default_python(os.path.join(folder, "notebook.ipynb"))


def spec_from_args(ns: argparse.Namespace) -> JobSpec:
    """The kernel's JobSpec from ``headroom kernel install``'s flags (``add_option_arguments``,
    ``--python``, ``--env``), read by ``spec_from_cli`` as for ``headroom run``: no script, no
    folder, no job name (a kernel is named after its notebook), the interpreter from
    ``kernel_python``. Raises SpecError (one line)."""
    values = dict(vars(ns), script="kernel", script_args=[], name=None, cwd=None, python=None)
    spec = spec_from_cli(argparse.Namespace(**values))
    return replace(
        spec, script="", args=(), cwd=None, python=kernel_python(getattr(ns, "python", None))
    )


def check_spec(spec: JobSpec, gpus: Sequence[GpuReading] = ()) -> List[str]:
    """Warnings for a kernel's spec (``spec.python`` set); raises SpecError for one that cannot
    run, as ``validate`` does for ``headroom run``: the interpreter and the checkpoint folder are
    looked at on disk (a folder that holds a checkpoint is fine: a notebook resumes from it)."""
    warnings = validate(spec, gpus, check_paths=False)
    check_python(spec.python or "")
    if spec.checkpoint_dir is not None:
        _check_writable(spec.checkpoint_dir)
    return warnings


def kernel_json(
    spec: JobSpec,
    name: str,
    *,
    display_name: Optional[str] = None,
    gpus: Sequence[GpuReading] = (),
    ram_total_bytes: Optional[int] = None,
    process: Optional[JobProcess] = None,
    environ: Optional[Mapping[str, str]] = None,
    runner_dir: Optional[Path] = None,
) -> Dict[str, Any]:
    """The ``kernel.json`` of a kernel that runs as a guarded job with ``spec``'s options.

    ``spec``: as ``spec_from_cli`` reads ``headroom run``'s flags (its script, arguments and
    folder are not used), with ``python`` set (``kernel_python``). The preset is applied against
    ``gpus`` and ``ram_total_bytes`` now, as the engine applies it to a script's job; the
    options are planned by ``build_launch``. ``process``: the job's priority and OOM score
    (the ``[jobs]`` settings). ``environ`` (default ``os.environ``): HEADROOM_HOME, when set
    there, is handed to the kernel so it finds the same engine. Raises SpecError for a spec
    that cannot run."""
    if not spec.python:
        raise SpecError("--python: the kernel's interpreter is not set", sv.PYTHON)
    python = spec.python
    environ = os.environ if environ is None else environ
    runner = Path(runner_dir) if runner_dir is not None else default_runner_dir()
    given = spec
    if spec.preset:
        spec = apply_preset(spec, spec.preset, gpus, ram_total_bytes=ram_total_bytes)
    # build_launch plans a script: the runner's own bootstrap stands in for it (never run).
    plan = build_launch(
        replace(spec, script=str(runner / "bootstrap.py"), args=(), cwd=None),
        gpus=gpus,
        base_env={},
        runner_dir=runner,
        process=process if process is not None else JobProcess(),
    )
    env: Dict[str, str] = _memory_environment(plan.settings, python)
    env[protocol.ENV_OPTIONS] = plan.env[protocol.ENV_OPTIONS]
    env[protocol.ENV_PROCESS] = plan.env[protocol.ENV_PROCESS]
    engine_spec = {k: v for k, v in spec.to_json().items() if k not in _NOT_FOR_THE_ENGINE}
    shown = display_name or default_display_name(given.preset)
    env[KERNEL_ENV] = json.dumps(
        {"v": SPEC_VERSION, "name": name, "display_name": shown, "spec": engine_spec},
        sort_keys=True,
        separators=(",", ":"),
    )
    if environ.get(HOME_ENV):
        env[HOME_ENV] = os.path.abspath(environ[HOME_ENV])
    env.update(dict(spec.env))
    return {
        "argv": [python, str(runner / "bootstrap.py"), "--kernel", "-f", "{connection_file}"],
        "display_name": shown,
        "language": "python",
        "interrupt_mode": "signal",
        "env": env,
        "metadata": {
            "headroom": {
                "v": SPEC_VERSION,
                "python": python,
                "runner": str(runner),
                "options": spec_flags(given),
            }
        },
    }


def _memory_environment(settings: Sequence[Tuple[str, str, str]], python: str) -> Dict[str, str]:
    """The variables the plan sets for the memory options (the GPUs TensorFlow sees, memory
    growth, the allocator): not the job channel's (the kernel has none until the engine adopts
    it), not the activation of the interpreter's environment (Jupyter starts the interpreter
    as it is, as for any kernel), and not one the plan removes (Jupyter can only add)."""
    activation = {n for n, _, _ in interpreters.job_environment(python, {})[1]}
    skip = activation | {
        protocol.ENV_JOB_ID,
        protocol.ENV_ADDRESS,
        protocol.ENV_KEYFILE,
        protocol.ENV_OPTIONS,
        protocol.ENV_PROCESS,
        "PYTHONUNBUFFERED",
    }
    return {n: v for n, v, _ in settings if n not in skip and v != REMOVED}


# ---------------------------------------------------------------------------------------------
# Spec files


@dataclass(frozen=True)
class KernelEntry:
    """One kernel spec folder: ``headroom`` is False for a spec Headroom did not write;
    ``problem`` says why a spec is broken (unreadable, its interpreter or runner gone)."""

    name: str
    folder: Path
    display_name: str = ""
    python: str = ""
    runner: str = ""
    options: Tuple[str, ...] = ()
    headroom: bool = False
    problem: Optional[str] = None

    def to_json(self) -> JSONObject:
        return {
            "name": self.name,
            "folder": str(self.folder),
            "display_name": self.display_name,
            "python": self.python,
            "runner": self.runner,
            "options": list(self.options),
            "headroom": self.headroom,
            "problem": self.problem,
        }


def read_entry(folder: Path) -> KernelEntry:
    """The spec in ``folder`` (``<kernels>/<name>``), never raising: a missing, unreadable or
    corrupt kernel.json is an entry with a ``problem``."""
    name = folder.name.lower()
    path = folder / SPEC_FILE
    try:
        # O_NONBLOCK: a FIFO planted as kernel.json must not hang the listing (a regular file
        # reads as ever); anything but a regular file is not a spec.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return KernelEntry(name, folder, problem=f"{path}: not a regular file")
            raw = f.read(MAX_SPEC_BYTES + 1)
        if len(raw) > MAX_SPEC_BYTES:
            return KernelEntry(name, folder, problem=f"{path}: larger than a kernel spec")
        data = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        return KernelEntry(name, folder, problem=f"no {SPEC_FILE} in {folder}")
    except (OSError, ValueError, RecursionError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else "not valid JSON"
        return KernelEntry(name, folder, problem=f"{path}: {why}")
    if not isinstance(data, dict):
        return KernelEntry(name, folder, problem=f"{path}: not a JSON object")
    display = data.get("display_name")
    display = display if isinstance(display, str) else ""
    meta = data.get("metadata")
    ours = meta.get("headroom") if isinstance(meta, dict) else None
    argv = data.get("argv")
    command: List[str] = (
        argv if isinstance(argv, list) and all(isinstance(a, str) for a in argv) else []
    )
    no_command = None if command else f"{path}: its argv is not a command"
    if not isinstance(ours, dict):
        return KernelEntry(name, folder, display, command[0] if command else "", problem=no_command)
    python, runner = _text(ours.get("python")), _text(ours.get("runner"))
    options = ours.get("options")
    flags = tuple(str(x) for x in options) if isinstance(options, list) else ()
    return KernelEntry(
        name, folder, display, python, runner, flags, True, no_command or _broken(python, runner)
    )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _broken(python: str, runner: str) -> Optional[str]:
    if not python or not os.path.exists(python):
        return f"its interpreter is gone: {python or '(none)'}"
    if not runner or not os.path.isfile(os.path.join(runner, "bootstrap.py")):
        return (
            f"Headroom's runner is gone: {runner or '(none)'} (Headroom moved or was "
            "removed; install the kernel again)"
        )
    return None


def list_kernels(dirs: Sequence[Path]) -> List[KernelEntry]:
    """Every kernel spec in ``dirs``, Headroom's and others', by folder then name (a name in
    two folders: Jupyter takes the first)."""
    out: List[KernelEntry] = []
    for d in dirs:
        try:
            names = sorted(p for p in d.iterdir() if p.is_dir() and _NAME.match(p.name))
        except OSError:
            continue
        out += [read_entry(p) for p in names]
    return out


def find(name: str, dirs: Sequence[Path]) -> List[KernelEntry]:
    """The specs called ``name`` in ``dirs`` (Jupyter folds names to lower case)."""
    return [e for e in list_kernels(dirs) if e.name == name.lower()]


@dataclass(frozen=True)
class Installed:
    """What ``install`` did: the spec file, and the spec it replaced (None: a new one)."""

    path: Path
    replaced: Optional[KernelEntry] = None


def install(
    spec: Dict[str, Any],
    name: str,
    kernels_dir: Path,
    *,
    private: bool,
    replace_other: bool = False,
) -> Installed:
    """Write ``spec`` as ``<kernels_dir>/<name>/kernel.json`` through a temporary file: a spec
    already there is replaced when Headroom wrote it (or ``replace_other``); ``private``: the
    folder and file are the user's alone (0700, 0600), else readable by all (an environment
    others use). Raises KernelSpecError (the folder cannot be made or written)."""
    name = check_name(name)
    folder = kernels_dir / name
    old: Optional[KernelEntry] = read_entry(folder) if folder.is_dir() else None
    if old is not None and not old.headroom and old.problem is None and not replace_other:
        raise KernelSpecError(
            f"{folder} holds a kernel spec that Headroom did not write "
            f"({old.display_name or name}); choose another --name, or give "
            "--replace to replace it"
        )
    _check_trusted(folder)
    try:
        _make_dirs(folder, 0o700 if private else 0o755)
        _check_trusted(folder)
        if old is not None and not old.headroom:
            _clear(folder)  # another kernel's logos and files are not this one's
        text = json.dumps(spec, indent=1, sort_keys=True) + "\n"
        atomic_write(folder / SPEC_FILE, text, mode=0o600 if private else 0o644)
    except OSError as e:
        raise KernelSpecError(
            f"cannot write the kernel spec in {folder}: {e.strerror or e}"
        ) from None
    return Installed(folder / SPEC_FILE, old)


def _check_trusted(folder: Path) -> None:
    """Refuse a spec folder that is a link, or that another user could change: one of the
    folders it is in owned by someone else (root aside) or writable by all without the sticky
    bit. Jupyter runs the spec's command as whoever starts the kernel, so a spec another user
    can swap is their code run by this user."""
    if folder.is_symlink():
        raise KernelSpecError(
            f"{folder} is a symbolic link: the kernel spec is not written through it"
        )
    uid = os.getuid() if hasattr(os, "getuid") else None
    for at in [folder, *folder.parents]:
        try:
            st = at.stat()
        except OSError:
            continue  # not made yet: made below, by this user
        if uid is None:
            break
        if st.st_uid not in (uid, 0):
            raise KernelSpecError(
                f"{at} belongs to another user, who could change the kernel "
                "spec this user's notebooks run; choose a folder of your own"
            )
        if st.st_mode & 0o002 and not st.st_mode & 0o1000:
            raise KernelSpecError(
                f"{at} can be written by every user, who could change the "
                "kernel spec this user's notebooks run; choose a folder of "
                "your own"
            )


def _make_dirs(folder: Path, mode: int) -> None:
    """Make ``folder`` and the folders above it that are missing, each with ``mode`` (not the
    umask's: Headroom's own is private)."""
    missing: List[Path] = []
    at = folder
    while not at.exists():
        missing.append(at)
        if at.parent == at:
            break
        at = at.parent
    for d in reversed(missing):
        d.mkdir(mode=mode)
        os.chmod(d, mode)
    if not folder.is_dir():
        raise KernelSpecError(f"cannot write the kernel spec: {folder} is not a folder")


def _clear(folder: Path) -> None:
    for p in folder.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def remove(name: str, dirs: Sequence[Path]) -> List[Path]:
    """Remove Headroom's specs called ``name`` from ``dirs``; returns their folders. Raises
    KernelSpecError when there is none (naming a spec of that name Headroom did not write)."""
    found = find(name, dirs)
    ours = [e for e in found if e.headroom]
    if not ours:
        others = [e for e in found if not e.headroom]
        if others and others[0].problem:
            raise KernelSpecError(
                f"{others[0].problem}: whether Headroom wrote it cannot be "
                f"told, so it is left as it is (delete {others[0].folder} "
                "to remove it)"
            )
        if others:
            raise KernelSpecError(
                f"{others[0].folder} is not a Headroom kernel spec; remove it "
                "with: jupyter kernelspec remove " + name.lower()
            )
        raise KernelSpecError(
            f"no Headroom kernel spec called {name!r} (see 'headroom kernel list')"
        )
    out = []
    for e in ours:
        try:
            shutil.rmtree(e.folder)
        except OSError as err:
            raise KernelSpecError(f"cannot remove {e.folder}: {err.strerror or err}") from None
        out.append(e.folder)
    return out
