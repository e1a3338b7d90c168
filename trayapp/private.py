"""Private state: folders only this user can enter, files only this user can read, no links.

Everything under the state folder is 0700 folders and 0600 files, owned by the user. What another
user owns, or can write, is never trusted: the engine refuses to start on it and a client refuses
to talk through it, each with one line naming the path, what is wrong and the fix. Files are
opened without following a symbolic link (``O_NOFOLLOW``), and folders are checked with
``lstat``, so a link planted in the state cannot redirect a write or a connection.

The runtime folder (the control socket and its key) is ``<home>/run`` when the socket's path fits
in a Unix socket address; else ``$XDG_RUNTIME_DIR/headroom-<hash>`` where that folder exists and
is the user's (0700); else ``$TMPDIR/headroom-<uid>/<hash>``, where both levels must be the
user's and 0700 and the temporary folder itself must be the user's or root's and, if others can
write to it, sticky (so no one else can rename what is in it).

On Windows none of this applies (the pipes get a user-only security descriptor instead).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import stat
import sys
from pathlib import Path
from typing import IO, Any, Iterator, List, Optional, Tuple

from trayapp.errors import Refused
from trayapp.text import one_line

POSIX = sys.platform != "win32"
PRIVATE_UMASK = 0o077
# The umask a job gets: the user's own, handed from the command that started the engine.
USER_UMASK_ENV = "HEADROOM_USER_UMASK"

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)

# The engine's own files in the state folder, checked (no link, the user's) before it starts.
STATE_FILES = (
    "engine.lock",
    "engine.log",
    "engine.log.1",
    "engine.log.2",
    "engine.log.3",
    "headroom.db",
    "headroom.db-wal",
    "headroom.db-shm",
    "headroom.db-journal",
    "crash.log",
    "tray.lock",
    "tray.log",
    "tray.log.1",
    "tray.log.2",
    "launch-recent.json",
)

_user_umask: Optional[int] = None


class UnsafePath(Refused):
    """A path Headroom will not use. The message (one line) names it, says what is wrong and
    how to fix it."""

    def __init__(self, path: os.PathLike | str, problem: str, fix: str = ""):
        self.path = Path(path)
        self.problem = problem
        self.fix = fix
        text = f"{one_line(str(path))} {problem}"
        super().__init__(f"{text}; {fix}" if fix else text)


# -- umask ----------------------------------------------------------------------------------------


def use_private_umask() -> None:
    """Make every file this process creates private (umask 077), remembering the user's umask
    for the jobs. Called first thing by the command line."""
    global _user_umask
    if not POSIX:
        return
    previous = os.umask(PRIVATE_UMASK)
    # An engine started by another Headroom command gets the user's umask from it; the
    # variable is not passed on to anything else.
    handed = os.environ.pop(USER_UMASK_ENV, None)
    try:
        _user_umask = int(handed, 8) & 0o777 if handed else previous
    except ValueError:
        _user_umask = previous


def user_umask() -> Optional[int]:
    """The user's umask (for a job's processes), or None when this process never changed its
    own (then a job inherits it as it is)."""
    return _user_umask


def umask_env() -> dict:
    """What a Headroom command passes to an engine it starts, so the engine's jobs get the
    user's umask and not the engine's private one."""
    return {} if _user_umask is None else {USER_UMASK_ENV: f"{_user_umask:03o}"}


# -- describing what is wrong ---------------------------------------------------------------------


def _owner(uid: int) -> str:
    try:
        import pwd  # POSIX only (this module is imported on Windows too)

        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _q(path: os.PathLike | str) -> str:
    return shlex.quote(str(path))


def _mode(st: os.stat_result) -> str:
    return f"{stat.S_IMODE(st.st_mode):04o}"


def _writable_by_others(st: os.stat_result) -> bool:
    if st.st_mode & 0o002:
        return True
    return bool(st.st_mode & 0o020) and not _group_is_only_yours(st.st_gid)


def _group_is_only_yours(gid: int) -> bool:
    """A user private group (the default of Debian, Ubuntu and Fedora, with umask 002): the
    user's own primary group, named after the user, with no other member. Write access for it
    is write access for the user alone (as Debian's OpenSSH also judges it)."""
    try:
        import grp  # POSIX only, as pwd
        import pwd

        me = pwd.getpwuid(os.getuid())
        group = grp.getgrgid(gid)
    except (ImportError, KeyError):
        return False
    return gid == me.pw_gid and group.gr_name == me.pw_name and set(group.gr_mem) <= {me.pw_name}


def _link(path: os.PathLike | str) -> UnsafePath:
    return UnsafePath(
        path,
        "is a symbolic link, and Headroom follows no link in its state",
        f"remove it: rm {_q(path)}",
    )


def _check(
    path: os.PathLike | str,
    st: os.stat_result,
    *,
    folder: bool,
    private: bool,
    root_ok: bool = False,
    sticky_ok: bool = False,
) -> None:
    """Raise UnsafePath unless ``st`` (of ``path``) is a folder (or a file) of this user that
    no one else can write (and, with ``private``, read)."""
    if stat.S_ISLNK(st.st_mode):
        raise _link(path)
    if folder and not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(path, "is not a folder", f"remove it: rm {_q(path)}")
    if not folder and not stat.S_ISREG(st.st_mode) and not stat.S_ISSOCK(st.st_mode):
        raise UnsafePath(path, "is not a regular file", f"remove it: rm {_q(path)}")
    uid = os.getuid()
    if st.st_uid != uid and not (root_ok and st.st_uid == 0):
        raise UnsafePath(
            path,
            f"belongs to {_owner(st.st_uid)}, not to you ({_owner(uid)})",
            "Headroom uses only what is yours: remove it, or set HEADROOM_HOME to a "
            "folder of your own",
        )
    fix = f"fix: chmod {'700' if folder else '600'} {_q(path)}"
    if _writable_by_others(st) and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        raise UnsafePath(path, f"can be written by other users (mode {_mode(st)})", fix)
    if private and st.st_mode & 0o077:
        raise UnsafePath(path, f"can be read by other users (mode {_mode(st)})", fix)


# -- opening without following links --------------------------------------------------------------


def _open_regular(
    path: os.PathLike | str, flags: int, mode: int = 0o600, private: bool = False
) -> Tuple[int, os.stat_result]:
    """(descriptor, its stat) of the regular file ``path`` of this user, opened without
    following a link and without waiting on a FIFO; checked as ``_check`` does. The caller
    owns the descriptor."""
    try:
        # O_NONBLOCK: a FIFO put there is refused below instead of waited on for good.
        fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC | _NONBLOCK, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _link(path) from None
        if e.errno == errno.ENXIO:  # a FIFO no one reads, opened to write
            raise UnsafePath(path, "is not a regular file", f"remove it: rm {_q(path)}") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(path, "is not a regular file", f"remove it: rm {_q(path)}")
        _check(path, st, folder=False, private=private)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def open_private(
    path: os.PathLike | str, flags: int = os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode: int = 0o600
) -> int:
    """A descriptor on the regular file ``path`` of this user, opened without following a link
    (created ``mode`` when ``flags`` has O_CREAT), made 0600 if it was readable by others.

    Raises UnsafePath for a link, something not a file or a file of another user; OSError for
    the rest (no such file, no space)."""
    if not POSIX:  # pragma: no cover - Windows
        return os.open(path, flags | getattr(os, "O_BINARY", 0), mode)
    fd, st = _open_regular(path, flags, mode)
    try:
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o600)
        if _NONBLOCK and not flags & _NONBLOCK:
            os.set_blocking(fd, True)  # a job's stdout, the engine's log: as opened before
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_private_file(
    path: os.PathLike | str,
    mode: str = "ab",
    encoding: Optional[str] = None,
    errors: Optional[str] = None,
) -> IO:
    """``open(path, mode)`` for "ab", "a", "r+" (created when missing), "rb" or "r", through
    ``open_private``: no link followed, the file made 0600."""
    flags = {
        "a": os.O_WRONLY | os.O_APPEND | os.O_CREAT,
        "r+": os.O_RDWR | os.O_CREAT,
        "r": os.O_RDONLY,
    }[mode.replace("b", "")]
    fd = open_private(path, flags)
    try:
        if "b" in mode:
            return open(fd, mode)
        return open(fd, mode, encoding=encoding, errors=errors)
    except BaseException:
        os.close(fd)
        raise


def rotating_log_handler(path: os.PathLike | str, max_bytes: int, backups: int) -> Any:
    """A ``logging.handlers.RotatingFileHandler`` (UTF-8) whose file is opened through
    ``open_private``: no link followed, 0600. Raises OSError or UnsafePath."""
    from logging.handlers import RotatingFileHandler  # only processes that write a log

    class PrivateRotatingFileHandler(RotatingFileHandler):
        def _open(self) -> Any:
            return open_private_file(
                self.baseFilename,
                self.mode.replace("b", ""),
                encoding=self.encoding,
                errors=self.errors,
            )

    return PrivateRotatingFileHandler(
        path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8"
    )


def read_private(path: os.PathLike | str, limit: int = 1 << 20) -> bytes:
    """The bytes of ``path``, a file of this user that no one else can read or write, read
    without following a link. Raises UnsafePath (what is wrong, the fix), or OSError (missing,
    unreadable)."""
    if not POSIX:  # pragma: no cover - Windows
        with open(path, "rb") as f:
            return f.read(limit)
    fd, _ = _open_regular(path, os.O_RDONLY, private=True)
    with open(fd, "rb") as f:
        return f.read(limit)


def tighten(path: os.PathLike | str, folder: bool = False) -> None:
    """Make an existing file (or folder) of this user 0600 (0700) without following a link.
    Missing: nothing to do. Raises UnsafePath for a link, another user's or a writable one."""
    if not POSIX:  # pragma: no cover - Windows
        return
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    _check(path, st, folder=folder, private=False)
    if not st.st_mode & 0o077 or stat.S_ISSOCK(st.st_mode):
        return
    fd = os.open(
        path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _NONBLOCK | (_DIRECTORY if folder else 0)
    )
    try:
        if os.path.samestat(os.fstat(fd), st):
            os.fchmod(fd, 0o700 if folder else 0o600)
    finally:
        os.close(fd)


# -- folders --------------------------------------------------------------------------------------


def make_private_dir(path: os.PathLike | str, *, follow: bool = False) -> None:
    """Create ``path`` (0700) or take the one there: it must be this user's folder, not a link
    (unless ``follow``: a home the user linked elsewhere) and not writable by others; one that
    others can only read is made 0700. Raises UnsafePath (the message says the fix) or OSError."""
    p = Path(path)
    if not POSIX:  # pragma: no cover - Windows
        p.mkdir(parents=True, exist_ok=True)
        return
    try:
        p.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        p.parent.mkdir(parents=True, exist_ok=True)
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            pass
    try:
        fd = os.open(p, os.O_RDONLY | _DIRECTORY | _CLOEXEC | (0 if follow else _NOFOLLOW))
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            _check(p, os.lstat(p), folder=True, private=False)
        raise
    try:
        st = os.fstat(fd)
        _check(p, st, folder=True, private=False)
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def check_dir(
    path: os.PathLike | str,
    *,
    private: bool = True,
    follow: bool = False,
    root_ok: bool = False,
    sticky_ok: bool = False,
) -> None:
    """Raise UnsafePath unless ``path`` is a folder of this user (``root_ok``: or root's) that
    no one else can write (``sticky_ok``: unless it is sticky) nor, with ``private``, read.
    FileNotFoundError when it is missing."""
    if not POSIX:  # pragma: no cover - Windows
        return
    st = os.stat(path) if follow else os.lstat(path)
    _check(path, st, folder=True, private=private, root_ok=root_ok, sticky_ok=sticky_ok)


def check_file(
    path: os.PathLike | str, *, private: bool = True, follow: bool = False, root_ok: bool = False
) -> None:
    """Raise UnsafePath unless ``path`` is a file (or socket) of this user (``root_ok``: or
    root's) that no one else can write (nor, with ``private``, read); ``follow``: a link to
    such a file will do. FileNotFoundError when it is missing."""
    if not POSIX:  # pragma: no cover - Windows
        return
    st = os.stat(path) if follow else os.lstat(path)
    _check(path, st, folder=False, private=private, root_ok=root_ok)


# -- the runtime folder ---------------------------------------------------------------------------


def xdg_runtime_dir() -> Optional[Path]:
    """``$XDG_RUNTIME_DIR`` when it is set, absolute, and a 0700 folder of this user; else
    None (it is then not used)."""
    value = os.environ.get("XDG_RUNTIME_DIR", "")
    if not POSIX or not value or not os.path.isabs(value):
        return None
    try:
        check_dir(value, private=True)
    except (OSError, UnsafePath):
        return None
    return Path(value)


def runtime_chain(data_dir: Path, runtime_dir: Path) -> Tuple[Path, str, List[Path]]:
    """(anchor, kind, levels): the folder the runtime folder hangs from, what it must be
    ("home": the user's, not writable by others; "private": the user's, 0700; "shared": the
    user's or root's, sticky if others can write it), and the levels below it, down to the
    runtime folder, that must each be the user's and 0700."""
    if runtime_dir.parent == data_dir:
        return data_dir, "home", [runtime_dir]
    if runtime_dir.parent.name == f"headroom-{os.getuid() if POSIX else 0}":
        return runtime_dir.parent.parent, "shared", [runtime_dir.parent, runtime_dir]
    return runtime_dir.parent, "private", [runtime_dir]


def _check_anchor(anchor: Path, kind: str) -> None:
    if kind == "home":
        check_dir(anchor, private=False, follow=True)
    elif kind == "shared":
        check_dir(anchor, private=False, follow=True, root_ok=True, sticky_ok=True)
    else:
        check_dir(anchor, private=True)


def check_runtime(data_dir: Path, runtime_dir: Path) -> None:
    """A client's check before it trusts the runtime folder: every level Headroom relies on is
    the user's, 0700 and not a link. Raises UnsafePath, or FileNotFoundError when a level is
    missing (no engine made it)."""
    if not POSIX:  # pragma: no cover - Windows
        return
    anchor, kind, levels = runtime_chain(data_dir, runtime_dir)
    with _shared_hint(kind):
        _check_anchor(anchor, kind)
        for level in levels:
            check_dir(level, private=True)


def ensure_runtime(data_dir: Path, runtime_dir: Path) -> None:
    """The engine's (and the tray's): create the runtime folder's levels 0700, refusing any
    level that is another user's, a link or writable by others (UnsafePath)."""
    if not POSIX:  # pragma: no cover - Windows
        runtime_dir.mkdir(parents=True, exist_ok=True)
        return
    anchor, kind, levels = runtime_chain(data_dir, runtime_dir)
    if kind == "home":
        make_private_dir(anchor, follow=True)
    with _shared_hint(kind):
        _check_anchor(anchor, kind)
        for level in levels:
            make_private_dir(level)


@contextlib.contextmanager
def _shared_hint(kind: str) -> Iterator[None]:
    """In a shared temporary folder the user cannot remove another user's folder: say what
    avoids it instead."""
    try:
        yield
    except UnsafePath as e:
        if kind != "shared" or "belongs to" not in e.problem:
            raise
        raise UnsafePath(
            e.path,
            e.problem,
            "someone may be trying to intercept Headroom's connections; a shorter "
            "HEADROOM_HOME (the socket then fits in it), or TMPDIR set to a folder "
            "of your own, avoids this folder",
        ) from None


# -- the whole state ------------------------------------------------------------------------------


def ensure_state(
    home: Path, data_dir: Path, config_file: Path, jobs_dir: Path, runtime_dir: Path
) -> None:
    """Make the state private, or refuse it: the home (created 0700; one of the user's that
    others can read is made 0700), ``jobs/`` and the runtime folder's levels 0700, the engine's
    files and ``config.toml`` the user's, not links, 0600. Raises UnsafePath naming the first
    problem and its fix; OSError when a folder cannot be made."""
    if not POSIX:  # pragma: no cover - Windows
        for d in (data_dir, config_file.parent, jobs_dir):
            d.mkdir(parents=True, exist_ok=True)
        runtime_dir.mkdir(parents=True, exist_ok=True)
        return
    make_private_dir(data_dir, follow=True)
    in_home = config_file.parent == data_dir
    if not in_home:
        # The platform's config folder, or one named with --config (the user's dotfiles, or
        # /etc): made when missing, checked, never chmodded.
        if not config_file.parent.exists():
            make_private_dir(config_file.parent)
        check_dir(config_file.parent, private=False, follow=True, root_ok=True)
    check_config(config_file, tighten_it=in_home)
    make_private_dir(jobs_dir)
    for name in STATE_FILES:
        tighten(data_dir / name)
    ensure_runtime(data_dir, runtime_dir)
    for folder in _job_folders(jobs_dir):
        tighten(folder, folder=True)
        for entry in os.scandir(folder):
            if entry.is_file(follow_symlinks=False):
                tighten(entry.path)


def check_config(config_file: Path, tighten_it: bool = True) -> None:
    """``config.toml`` must be the user's (or root's) and writable by no one else; it may be a
    link (to the user's dotfiles, say) to such a file. With ``tighten_it``, one of the user's
    that others can read is made 0600. Missing: nothing to check. Raises UnsafePath."""
    if not POSIX:  # pragma: no cover - Windows
        return
    try:
        lst = os.lstat(config_file)
    except FileNotFoundError:
        return
    check_file(config_file, private=False, follow=True, root_ok=True)
    if tighten_it and not stat.S_ISLNK(lst.st_mode) and lst.st_uid == os.getuid():
        tighten(config_file)


def _job_folders(jobs_dir: Path) -> Iterator[str]:
    try:
        entries = list(os.scandir(jobs_dir))
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            yield entry.path
