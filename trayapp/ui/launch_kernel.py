"""The launch dialog's "Install as a Jupyter kernel" off the GUI thread: the form's spec
written as a kernel spec in the user's Jupyter folder, and the one line that says how it went.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Sequence, Tuple

from trayapp.jobs import kernelspec as ks
from trayapp.jobs import plan as planmod
from trayapp.jobs.options import JobSpec, SpecError
from trayapp.ui.forms import one_line


def install_kernel_spec(
    spec: JobSpec,
    gpus: Sequence[Any],
    ram_total_bytes: Optional[int],
    process: planmod.JobProcess,
    environ: Dict[str, str],
) -> Tuple[bool, str]:
    """Write ``spec`` as a kernel spec in the user's Jupyter folder (``headroom kernel install``
    with the dialog's options; runs off the GUI thread). Returns (done, the line to show)."""
    try:
        ks.check_spec(spec, gpus)
        problem = ks.ipykernel_problem(spec.python or "")
        if problem:
            return False, f"Not installed: {problem}"
        name = ks.default_name(spec.preset)
        data = ks.kernel_json(
            spec, name, gpus=gpus, ram_total_bytes=ram_total_bytes, process=process, environ=environ
        )
        done = ks.install(data, name, ks.user_kernels_dir(environ), private=True)
    except (SpecError, ks.KernelSpecError) as e:
        return False, f"Not installed: {one_line(e)}"
    verb = "Replaced" if done.replaced is not None else "Installed"
    return True, (
        f"{verb} the Jupyter kernel \u201c{data['display_name']}\u201d, which runs "
        f"{_home_short(spec.python or '')}, in {_home_short(str(done.path.parent))}"
    )


def _home_short(path: str) -> str:
    """``path`` with the home folder as ``~``."""
    home = os.path.expanduser("~")
    if home not in ("", "~", os.sep) and (path == home or path.startswith(home + os.sep)):
        return "~" + path[len(home) :]
    return path
