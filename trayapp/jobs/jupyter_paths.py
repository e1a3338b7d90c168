"""Where Jupyter keeps kernel specs, found the way ``jupyter_core`` finds them (nothing of
Jupyter is imported), and what a kernel's interpreter says of itself (its ``sys.prefix``,
whether it has ``ipykernel``), asked in the environment a job of it gets.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path
from typing import List, Mapping, Optional, Sequence

from trayapp.errors import Refused
from trayapp.jobs import interpreters
from trayapp.text import one_line

IPYKERNEL_TIMEOUT_S = 60.0  # importing ipykernel on a cold disk takes seconds, not minutes


class KernelSpecError(Refused):
    """A kernel spec that cannot be installed, found or removed: one line for the user."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


# ---------------------------------------------------------------------------------------------
# Where Jupyter keeps kernel specs


def _truthy(value: Optional[str]) -> bool:
    """jupyter_core's ``envset``: set to anything but no, n, false, off, 0 or 0.0."""
    return value is not None and value.strip().lower() not in (
        "no",
        "n",
        "false",
        "off",
        "0",
        "0.0",
    )


def jupyter_data_dir(
    environ: Optional[Mapping[str, str]] = None, platform: Optional[str] = None
) -> Path:
    """The user's Jupyter data folder, as ``jupyter_core.paths.jupyter_data_dir`` finds it:
    JUPYTER_DATA_DIR; with JUPYTER_PLATFORM_DIRS the platformdirs folder; else on Linux
    ``$XDG_DATA_HOME/jupyter`` (``~/.local/share/jupyter``), on macOS ``~/Library/Jupyter``, on
    Windows ``%APPDATA%\\jupyter``."""
    env = os.environ if environ is None else environ
    platform = sys.platform if platform is None else platform
    if env.get("JUPYTER_DATA_DIR"):
        return Path(env["JUPYTER_DATA_DIR"])
    if _truthy(env.get("JUPYTER_PLATFORM_DIRS")):
        import platformdirs  # only here: it costs the other commands' start

        return Path(platformdirs.user_data_dir("jupyter", appauthor=False))
    home = os.path.realpath(os.path.expanduser("~"))
    if platform == "darwin":
        return Path(home, "Library", "Jupyter")
    if platform == "win32":
        if env.get("APPDATA"):
            return Path(env["APPDATA"], "jupyter")
        config = env.get("JUPYTER_CONFIG_DIR") or os.path.join(home, ".jupyter")
        return Path(config, "data")
    return Path(env.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share"), "jupyter")


def user_kernels_dir(environ: Optional[Mapping[str, str]] = None) -> Path:
    """Where ``headroom kernel install`` writes by default (``--user``)."""
    return jupyter_data_dir(environ) / "kernels"


def prefix_kernels_dir(prefix: str) -> Path:
    """``--prefix P``: ``P/share/jupyter/kernels`` (Jupyter run from the environment at P
    finds it)."""
    return Path(os.path.abspath(prefix)) / "share" / "jupyter" / "kernels"


def python_prefix(python: str, timeout_s: float = IPYKERNEL_TIMEOUT_S) -> str:
    """``sys.prefix`` of ``python`` (for ``--sys-prefix``), asked of it. Raises
    KernelSpecError."""
    out = _ask(python, "import sys; print(sys.prefix)", timeout_s)
    if out.returncode != 0 or not out.stdout.strip():
        raise KernelSpecError(
            f"--sys-prefix: {python} did not say its sys.prefix (exit status {out.returncode})"
        )
    return out.stdout.strip().splitlines()[-1]


def search_dirs(
    environ: Optional[Mapping[str, str]] = None, extra: Sequence[Path] = ()
) -> List[Path]:
    """The kernel folders Jupyter searches, in its order (``jupyter_core.paths.jupyter_path(
    "kernels")`` as seen from this Python: JUPYTER_PATH, the user's folder and this
    environment's, the environment's first in a venv or with JUPYTER_PREFER_ENV_PATH, then the
    system's), then ``extra``; each once."""
    env = os.environ if environ is None else environ
    dirs: List[Path] = [
        Path(p.rstrip(os.sep), "kernels")
        for p in (env.get("JUPYTER_PATH") or "").split(os.pathsep)
        if p
    ]
    user = [user_kernels_dir(env)]
    userbase = getattr(site, "USER_BASE", None)
    if site.ENABLE_USER_SITE and userbase:
        user.append(Path(userbase, "share", "jupyter", "kernels"))
    own = [] if getattr(sys, "frozen", False) else [prefix_kernels_dir(sys.prefix)]
    if "JUPYTER_PREFER_ENV_PATH" in env:
        env_first = _truthy(env["JUPYTER_PREFER_ENV_PATH"])
    else:
        env_first = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
    dirs += own + user if env_first else user + own
    if os.name == "nt":
        if _truthy(env.get("JUPYTER_USE_PROGRAMDATA")) and env.get("PROGRAMDATA"):
            dirs.append(Path(env["PROGRAMDATA"], "jupyter", "kernels"))
    else:
        dirs += [Path("/usr/local/share/jupyter/kernels"), Path("/usr/share/jupyter/kernels")]
    dirs += list(extra)
    out: List[Path] = []
    for d in dirs:
        if d not in out:
            out.append(d)
    return out


# ---------------------------------------------------------------------------------------------
# The interpreter


def _ask(python: str, code: str, timeout_s: float) -> subprocess.CompletedProcess:
    """Run ``python -c code`` in the environment a job of it gets (not Headroom's own path).
    Raises KernelSpecError when it cannot be run or takes longer than ``timeout_s``."""
    env, _ = interpreters.job_environment(python, os.environ)
    try:
        return subprocess.run(
            [python, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            errors="replace",
        )
    except subprocess.TimeoutExpired:
        raise KernelSpecError(f"--python: {python} did not answer within {timeout_s:g} s") from None
    except OSError as e:
        raise KernelSpecError(f"--python: cannot run {python}: {e.strerror or e}") from None


def ipykernel_problem(python: str, timeout_s: float = IPYKERNEL_TIMEOUT_S) -> Optional[str]:
    """None when ``python`` can import ipykernel, else one line saying so and how to install
    it. Raises KernelSpecError when ``python`` cannot be run at all."""
    out = _ask(python, "import ipykernel", timeout_s)
    if out.returncode == 0:
        return None
    return (
        f"{python} has no ipykernel, which a Jupyter kernel needs; install it with: "
        f"{python} -m pip install ipykernel"
    )
