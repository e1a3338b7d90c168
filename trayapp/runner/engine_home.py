"""Where the engine of this user listens, found inside a job without Headroom installed.

The same answer as ``trayapp.config.paths.get_paths`` (a unit test holds the two together),
with the standard library only: ``HEADROOM_HOME`` when set, else the platform's data folder
as ``platformdirs`` names it. A kernel started by Jupyter uses it to find the engine's control
channel and register with it.
"""

import os
import sys

APP_NAME = "headroom"
_SOCKET_PATH_MAX = 100


def data_dir(environ=None):
    """The engine's state folder (absolute)."""
    env = os.environ if environ is None else environ
    home = env.get("HEADROOM_HOME")
    if home:
        import pathlib  # kernel mode only: as get_paths spells it (no ".." folded)

        return str(pathlib.Path(home).expanduser().absolute())
    if sys.platform == "win32":  # pragma: no cover - Windows
        base = env.get("LOCALAPPDATA") or os.path.expanduser(r"~\AppData\Local")
        return os.path.join(base, APP_NAME)
    if sys.platform == "darwin":  # pragma: no cover - macOS
        return os.path.expanduser(os.path.join("~/Library/Application Support", APP_NAME))
    base = env.get("XDG_DATA_HOME", "").strip() or os.path.expanduser("~/.local/share")
    return os.path.join(base, APP_NAME)


def _short_hash(text):
    import hashlib  # a long home or Windows only: a kernel's start does not pay for it

    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _private_dir(path):
    """A folder of this user that nobody else can enter (what XDG_RUNTIME_DIR must be)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    import stat  # only off the common path (a long home)

    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def runtime_dir(data, environ=None):
    """The folder of the engine's socket and key for the state folder ``data``."""
    env = os.environ if environ is None else environ
    candidate = os.path.join(data, "run")
    probe = os.path.join(candidate, "job-0123456789ab.sock")
    if sys.platform == "win32" or len(probe) <= _SOCKET_PATH_MAX:
        return candidate
    xdg = env.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isabs(xdg) and _private_dir(xdg):
        candidate = os.path.join(xdg, "headroom-" + _short_hash(data))
        if len(os.path.join(candidate, "job-0123456789ab.sock")) <= _SOCKET_PATH_MAX:
            return candidate
    import tempfile  # see _short_hash

    return os.path.join(tempfile.gettempdir(), f"headroom-{os.getuid()}", _short_hash(data))


def control(environ=None):
    """(address, key file) of the engine's control channel."""
    data = data_dir(environ)
    run = runtime_dir(data, environ)
    if sys.platform == "win32":  # pragma: no cover - Windows
        address = r"\\.\pipe\headroom-" + _short_hash(data)
    else:
        address = os.path.join(run, "engine.sock")
    return address, os.path.join(run, "engine.key")


def read_key(path, limit=4096):
    """The engine's key, or None: missing, or not a plain file of this user closed to others
    (a key anyone else could have planted or read is not trusted)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        import stat  # see _private_dir

        if not stat.S_ISREG(st.st_mode):
            return None
        if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o077):
            return None
        data = os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data or None
