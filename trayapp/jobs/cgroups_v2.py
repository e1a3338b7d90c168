"""cgroup v2 with a systemd user manager: what is found, and the pure parts of a job's scope.

On the unified hierarchy (what desktops run: Ubuntu 22.04+, Fedora, Debian 12) a user may not
make cgroups where they like: the systemd user manager (``user@UID.service``) owns the user's
delegated subtree and makes a transient scope for a job when asked (``StartTransientUnit``
over the user's D-Bus, what ``systemd-run --user --scope`` does). Inside the scope the user
owns ``memory.high`` (the brake: a task above it stalls in reclaim, it is not killed),
``memory.max`` (a last line above it: the OOM killer), ``cgroup.freeze`` and ``cgroup.kill``.

This module reads files and nothing else (no trayapp imports): ``user_manager`` says whether
the machine offers scopes (and why not, in one line), the parsers read ``memory.events``,
``memory.pressure`` and the limits. The scopes themselves are ``trayapp.jobs.scopes``.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Callable, Dict, Mapping, Optional, Tuple

MiB = 1024 * 1024
# memory.max stays this far above memory.high (the larger of the two): the brake is the high
# limit; the max limit only ends a job that overran it anyway (a kernel that could not
# reclaim fast enough), which is then relaunched smaller as an OOM kill.
MAX_MARGIN_BYTES = 128 * MiB
MAX_MARGIN_SHARE = 0.25
# A job is held at its high limit when its use is this close to it and the kernel throttled
# it lately (the ``high`` count of memory.events rose within HIGH_WINDOW_SECONDS), or its
# scope's pressure says its tasks stall (PSI ``full`` avg10 at least PSI_FULL_STALL percent).
HIGH_WINDOW_SECONDS = 2.0
PSI_FULL_STALL = 10.0


def high_slack(high: int) -> int:
    """How far from ``memory.high`` a job held at it may read (the kernel reclaims it a batch
    of pages below, or lets an allocation in flight pass it a little): two percent, at least
    four MiB."""
    return max(4 * MiB, high // 50)


def max_above(high: int) -> int:
    """The ``memory.max`` for a ``memory.high`` of ``high`` bytes."""
    return high + max(MAX_MARGIN_BYTES, int(high * MAX_MARGIN_SHARE))


def parse_limit(text: str) -> Optional[int]:
    """``memory.high`` / ``memory.max`` -> bytes, None for ``max``. Raises ValueError."""
    value = text.strip()
    if value == "max":
        return None
    return int(value)


def parse_pressure(text: str) -> Dict[str, Dict[str, float]]:
    """A PSI file (``memory.pressure``) -> {"some": {"avg10": ..., ...}, "full": {...}}; what
    is not ``kind key=number ...`` is left out."""
    out: Dict[str, Dict[str, float]] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0] not in ("some", "full"):
            continue
        values: Dict[str, float] = {}
        for field in parts[1:]:
            key, sep, number = field.partition("=")
            if not sep:
                continue
            try:
                values[key] = float(number)
            except ValueError:
                continue
        out[parts[0]] = values
    return out


def psi_avg10(pressure: Mapping[str, Mapping[str, float]], kind: str) -> Optional[float]:
    value = pressure.get(kind, {}).get("avg10")
    return value if value is not None and value >= 0 else None


SCOPE_RE = r"{prefix}{job}(?:-\d+)?\.scope"


def scope_name(prefix: str, job_id: str, pid: int) -> str:
    """The unit of job ``job_id``'s run whose first process is ``pid``: one scope a run (the
    last run's scope may not be collected yet when the next starts)."""
    return f"{prefix}{job_id}-{pid}.scope"


def is_scope_of(name: str, prefix: str, job_id: str) -> bool:
    """Whether cgroup folder ``name`` is a scope of job ``job_id`` (``scope_name``)."""
    return (
        re.fullmatch(SCOPE_RE.format(prefix=re.escape(prefix), job=re.escape(job_id)), name)
        is not None
    )


def start_argv(unit: str, pid: int, description: str) -> list:
    """The ``busctl`` command that asks the user's systemd manager for transient scope ``unit``
    holding process ``pid`` (memory accounting on). It is collected once it ends, unless it
    failed: a scope whose process the OOM killer ended stays, failed with the result
    ``oom-kill``, until the engine has asked (``result_argv``) and reset it."""
    return [
        "busctl",
        "--user",
        "--quiet",
        "call",
        "org.freedesktop.systemd1",
        "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager",
        "StartTransientUnit",
        "ssa(sv)a(sa(sv))",
        unit,
        "fail",
        "3",
        "PIDs",
        "au",
        "1",
        str(int(pid)),
        "MemoryAccounting",
        "b",
        "true",
        "Description",
        "s",
        description,
        "0",
    ]


def result_argv(unit: str) -> list:
    """The command that says how scope ``unit`` ended (``oom-kill``, ``success``; "" where
    the manager no longer has it)."""
    return ["systemctl", "--user", "show", "--property=Result", "--value", unit]


def reset_argv(unit: str) -> list:
    return ["systemctl", "--user", "reset-failed", unit]


def manager_environ(environ: Mapping[str, str], uid: int) -> Dict[str, str]:
    """The environment ``busctl --user`` needs to find the user's bus."""
    env = dict(environ)
    env.setdefault("XDG_RUNTIME_DIR", f"/run/user/{uid}")
    return env


def user_manager(
    root: str,
    own_path: str,
    environ: Mapping[str, str],
    uid: int,
    which: Callable[[str], Optional[str]] = shutil.which,
) -> Tuple[Optional[str], str]:
    """Whether this machine gives the user's jobs transient scopes: (the folder of
    ``user@UID.service`` under ``root``, a line saying so), or (None, why not). ``own_path``:
    the engine's own cgroup (the ``0::`` line of ``/proc/self/cgroup``). Never raises."""
    if not os.path.isfile(os.path.join(root, "cgroup.controllers")):
        return None, f"{root} is not a cgroup v2 hierarchy"
    runtime = environ.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
    service_name = f"user@{uid}.service"
    if (
        not os.path.exists(os.path.join(runtime, "systemd", "private"))
        and f"/{service_name}" not in own_path
    ):
        return None, f"cgroup v2 without a running systemd user manager ({service_name})"
    service = os.path.join(root, "user.slice", f"user-{uid}.slice", service_name)
    if not os.path.isdir(service):
        return None, f"cgroup v2 without a cgroup for {service_name} (no systemd delegation)"
    try:
        with open(os.path.join(service, "cgroup.controllers")) as f:
            controllers = f.read().split()
    except OSError as e:
        return None, f"cannot read the controllers of {service}: {(e.strerror or e)}".lower()
    if "memory" not in controllers:
        return None, f"the memory controller is not delegated to {service_name}"
    try:
        read_only = bool(os.statvfs(service).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        read_only = False
    if read_only:
        return None, f"the cgroup file system at {root} is read-only"
    if not os.access(service, os.W_OK):
        return None, f"{service} is not delegated to this user (not writable)"
    if not environ.get("DBUS_SESSION_BUS_ADDRESS") and not os.path.exists(
        os.path.join(runtime, "bus")
    ):
        return None, (
            f"no user D-Bus ({runtime}/bus): the systemd user manager cannot be asked for scopes"
        )
    if which("busctl") is None:
        return None, "busctl (systemd) is not on PATH"
    return service, f"transient scopes of {service_name}"
