"""The engine's own process: the lock that makes it the one engine of a state folder, its
memory lock and priority, its log, and its resource limits as the status says them."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import IO, Dict, List, Optional

from trayapp import private
from trayapp.jobs.spec_values import own_rlimits
from trayapp.logformat import LogFormatter
from trayapp.text import one_line


class EngineLock:
    """An exclusive lock on a file: held while the process lives, gone when it dies."""

    def __init__(self, path: Path):
        self.path = path
        self._file: Optional[IO[str]] = None

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # No link followed: a planted engine.lock -> file must not get that file truncated.
        f = private.open_private_file(self.path, "r+")
        try:
            if sys.platform == "win32":  # pragma: no cover
                import msvcrt  # Windows only

                f.seek(0)
                msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)
            else:
                import fcntl  # POSIX only: not on Windows

                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            return False
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._file = f
        return True

    def holder_pid(self) -> Optional[int]:
        try:
            return int(private.read_private(self.path, limit=64).strip() or 0) or None
        except (OSError, ValueError):
            return None

    def release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


# -- making the process sturdy ------------------------------------------------------------------


def memlock_refused(euid: Optional[int] = None, limit: Optional[int] = None) -> str:
    """Why the engine's memory is not locked here ("" where it may be): with MCL_FUTURE every
    later mapping (a new thread's stack) is locked too and counts against RLIMIT_MEMLOCK, so a
    user's finite limit (8 MiB on most desktops) would make the engine unable to start a
    thread once it is reached. Root (CAP_IPC_LOCK) and an unlimited limit may lock."""
    import resource

    uid = os.geteuid() if euid is None else euid
    soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0] if limit is None else limit
    if uid == 0 or soft == resource.RLIM_INFINITY:
        return ""
    return (
        f"RLIMIT_MEMLOCK is {soft // 1024} KiB, and a locked engine could not start a "
        "thread past it"
    )


def harden_process() -> List[str]:
    """Lock the engine's memory and raise its priority where the OS allows it (Linux).

    Returns lines for the log saying what worked and what was refused; never raises.
    """
    notes: List[str] = []
    if not sys.platform.startswith("linux"):
        return notes
    refused = memlock_refused()
    try:
        import ctypes  # Linux only (mlockall)

        libc = ctypes.CDLL(None, use_errno=True)
        # MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT: pages stay in RAM once touched, without
        # faulting in every thread stack up front.
        if refused:
            notes.append(
                f"memory not locked ({refused}); the engine may be swapped out under pressure"
            )
        elif libc.mlockall(1 | 2 | 4) != 0:
            err = ctypes.get_errno()
            notes.append(
                f"memory not locked (mlockall refused: {os.strerror(err)}); the engine "
                "may be swapped out under pressure"
            )
        else:
            notes.append("memory locked (mlockall)")
    except (OSError, AttributeError) as e:
        notes.append(f"memory not locked ({e})")
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -5)
        notes.append("priority raised (nice -5)")
    except OSError as e:
        notes.append(f"priority not raised ({e.strerror})")
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("-100")
        notes.append("the kernel's OOM killer will prefer other processes (oom_score_adj -100)")
    except OSError as e:
        notes.append(f"oom_score_adj not lowered ({e.strerror})")
    return notes


def setup_logging(log_file: Path, to_stderr: bool = True, level: int = logging.INFO) -> None:
    """Log to stderr and to a rotating file under the state folder."""
    # A log file on a full disk must not print a traceback per line: the engine goes on.
    logging.raiseExceptions = False
    root = logging.getLogger("headroom")
    root.setLevel(level)
    # Escaped: a job's name or note in a message cannot break the line or reach a terminal.
    fmt = LogFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    for h in list(root.handlers):
        root.removeHandler(h)
    try:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        # Opened without following a link, 0600, like the rest of the state.
        fh = private.rotating_log_handler(log_file, max_bytes=1_000_000, backups=3)
        fh.setFormatter(fmt)
        root.addHandler(fh)
    except (OSError, private.UnsafePath) as e:
        why = e.strerror if isinstance(e, OSError) else one_line(e)
        print(f"headroom: cannot write the log file {log_file} ({why})", file=sys.stderr)
    if to_stderr:
        sh = logging.StreamHandler(sys.stderr)
        sh.setFormatter(fmt)
        root.addHandler(sh)
    root.propagate = False


def rlimits_json() -> Optional[Dict[str, List[Optional[int]]]]:
    """The engine's own resource limits, None: unlimited; None on Windows. ``headroom run
    --dry-run`` says where a job's differ."""
    return {name: [soft, hard] for name, soft, hard in own_rlimits()} or None
