"""``headroom kernel install | list | remove``: Jupyter kernel specs whose kernel is a guarded job.
The spec is built by ``jobs.kernelspec`` from the flags of ``headroom run``; an engine is not
needed (the kernel registers with one when it starts)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import List, Optional, Sequence

from trayapp import config as configmod
from trayapp.cli.base import EXIT_OK, EXIT_USAGE, UsageError, demo, say, show
from trayapp.cli.run import local_gpus
from trayapp.config import Paths
from trayapp.jobs import kernelspec as ks
from trayapp.jobs.options import SpecError, resolve_python
from trayapp.jobs.plan import JobProcess
from trayapp.probes.memory import make_memory_probe
from trayapp.text import one_line

OPTIONS_WIDTH = 60  # the options column of `kernel list` is cut here


def cmd_kernel(args: argparse.Namespace, paths: Paths) -> int:
    action = getattr(args, "kernel_command", None)
    try:
        if action == "install":
            return _install(args, paths)
        if action == "list":
            return _list(args)
        if action == "remove":
            return _remove(args)
    except (ks.KernelSpecError, SpecError) as e:
        raise UsageError(one_line(e)) from None
    raise UsageError(
        "headroom kernel: say what to do: install, list or remove (see 'headroom kernel --help')"
    )


def _target_python(args: argparse.Namespace) -> Optional[str]:
    """``--python`` as an absolute path (None when not given); raises UsageError."""
    if not getattr(args, "python", None):
        return None
    python = os.path.abspath(resolve_python(args.python))
    if not os.path.exists(python):
        raise UsageError(f"--python: not found: {python}")
    return python


def _kernels_dir(args: argparse.Namespace, python: Optional[str]) -> Optional[Path]:
    """The folder ``--prefix`` or ``--sys-prefix`` names (None: the user's, by default)."""
    if getattr(args, "prefix", None):
        return ks.prefix_kernels_dir(args.prefix)
    if getattr(args, "sys_prefix", False):
        return ks.prefix_kernels_dir(ks.python_prefix(python or ks.kernel_python(None)))
    return None


def _install(args: argparse.Namespace, paths: Paths) -> int:
    spec = ks.spec_from_args(args)
    python = spec.python or ""
    gpus = local_gpus(demo(args))
    warnings = ks.check_spec(spec, gpus)
    name = ks.check_name(args.name or ks.default_name(spec.preset))
    if args.display_name is not None and not args.display_name.strip():
        raise UsageError("--display-name: give a name Jupyter can show")
    folder = _kernels_dir(args, python) or ks.user_kernels_dir()
    problem = ks.ipykernel_problem(python)
    if problem:
        say(problem)
        return EXIT_USAGE
    config = configmod.load(paths.config_file)
    data = ks.kernel_json(
        spec,
        name,
        display_name=args.display_name,
        gpus=gpus,
        ram_total_bytes=make_memory_probe().read().total_bytes,
        process=JobProcess.from_config(config),
    )
    for w in warnings:
        say(f"warning: {w}")
    if args.dry_run:
        show(f"# {folder / name / ks.SPEC_FILE} (not written: --dry-run)")
        print(json.dumps(data, indent=1, sort_keys=True))
        return EXIT_OK
    private = not (args.prefix or args.sys_prefix)
    done = ks.install(data, name, folder, private=private, replace_other=args.replace)
    old = done.replaced
    if old is None:
        show(f"Installed the kernel spec {name} in {done.path.parent}")
    elif old.headroom:
        show(
            f"Replaced the kernel spec {name} in {done.path.parent} (it was installed before; "
            "it now has these options)"
        )
    elif old.problem:
        show(
            f"Replaced the kernel spec {name} in {done.path.parent} (the one before was "
            f"broken: {old.problem})"
        )
    else:
        show(
            f"Replaced the kernel spec {name} in {done.path.parent} (Headroom did not write "
            f"the one before: {old.display_name or name})"
        )
    show(
        f'  Jupyter lists it as "{data["display_name"]}"; its kernel runs {python} '
        "under Headroom's guard"
    )
    if not private:
        show(
            f"  Jupyter finds it when run from {folder.parent.parent.parent}, or with "
            f"JUPYTER_PATH={folder.parent}"
        )
    return EXIT_OK


def _search(args: argparse.Namespace) -> List[Path]:
    python = _target_python(args)
    extra = _kernels_dir(args, python)
    return ks.search_dirs(extra=[extra] if extra else [])


def _list(args: argparse.Namespace) -> int:
    entries = [e for e in ks.list_kernels(_search(args)) if e.headroom or e.problem]
    if args.json:
        print(json.dumps({"kernels": [e.to_json() for e in entries]}))
        return EXIT_OK
    if not entries:
        show("No Headroom kernel specs (install one with 'headroom kernel install').")
        return EXIT_OK
    show(format_list(entries), end="")
    return EXIT_OK


def format_list(entries: Sequence[ks.KernelEntry]) -> str:
    """The table of ``headroom kernel list``: name, display name, interpreter, options, and a
    line under a broken spec saying why."""
    rows = [("NAME", "DISPLAY NAME", "PYTHON", "OPTIONS")]
    for e in entries:
        options = " ".join(e.options) or ("-" if e.headroom else "?")
        if len(options) > OPTIONS_WIDTH:
            options = options[: OPTIONS_WIDTH - 3] + "..."
        rows.append(
            (
                one_line(e.name),
                one_line(e.display_name) or "?",
                one_line(e.python) or "?",
                one_line(options),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = []
    for i, row in enumerate(rows):
        cells = [row[c].ljust(widths[c]) for c in range(3)] + [row[3]]
        lines.append("  ".join(cells).rstrip())
        problem = entries[i - 1].problem if i else None
        if problem:
            lines.append(f"  ! broken: {one_line(problem)}")
    folders = sorted({str(e.folder.parent) for e in entries})
    lines.append("")
    lines.append("In: " + ", ".join(folders))
    return "\n".join(lines) + "\n"


def _remove(args: argparse.Namespace) -> int:
    removed = ks.remove(args.kernel, _search(args))
    for folder in removed:
        show(f"Removed the kernel spec {folder.name} from {folder.parent}")
    return EXIT_OK
