"""Where Headroom keeps its state: the settings file, the database, the logs, the sockets."""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from trayapp import private

APP_NAME = "headroom"


@dataclass(frozen=True)
class Paths:
    """Where Headroom keeps its state. Tests point ``HEADROOM_HOME`` at a temporary folder."""

    home: Path
    config_file: Path
    data_dir: Path
    runtime_dir: Path

    @property
    def db_file(self) -> Path:
        return self.data_dir / "headroom.db"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "engine.log"

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"

    @property
    def lock_file(self) -> Path:
        return self.data_dir / "engine.lock"

    @property
    def control_address(self) -> str:
        if sys.platform == "win32":
            return r"\\.\pipe\headroom-" + _short_hash(str(self.data_dir))
        return str(self.runtime_dir / "engine.sock")

    @property
    def key_file(self) -> Path:
        return self.runtime_dir / "engine.key"

    def job_address(self, job_id: str) -> str:
        if sys.platform == "win32":
            return r"\\.\pipe\headroom-" + _short_hash(str(self.data_dir)) + "-job-" + job_id
        return str(self.runtime_dir / f"job-{job_id}.sock")

    def ensure(self) -> None:
        """Create the folders, private to the user (0700), or refuse the state: raises
        UnsafePath (a ConfigError-like ValueError naming the path and the fix) when a part of
        it is another user's, a link, or writable by others (see ``trayapp.private``)."""
        private.ensure_state(
            self.home, self.data_dir, self.config_file, self.jobs_dir, self.runtime_dir
        )


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def ensure_private_dir(path: Path) -> None:
    """Make ``path`` a folder only this user can enter; refuse one owned by someone else, a
    link, or one others can write (UnsafePath, a ValueError naming the fix)."""
    private.make_private_dir(path)


# Unix socket paths must fit in sun_path (108 bytes on Linux, 104 on macOS).
_SOCKET_PATH_MAX = 100


def _runtime_dir_for(data_dir: Path) -> Path:
    candidate = data_dir / "run"
    if sys.platform == "win32" or len(str(candidate / "job-0123456789ab.sock")) <= _SOCKET_PATH_MAX:
        return candidate
    xdg = private.xdg_runtime_dir()
    if xdg is not None:
        candidate = xdg / f"headroom-{_short_hash(str(data_dir))}"
        if len(str(candidate / "job-0123456789ab.sock")) <= _SOCKET_PATH_MAX:
            return candidate
    # Both levels are checked (the user's, 0700, no link) by the engine and by every client.
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"headroom-{uid}" / _short_hash(str(data_dir))


def get_paths(config_override: Optional[str] = None) -> Paths:
    """The paths for this user, or under ``HEADROOM_HOME`` when it is set."""
    home_env = os.environ.get("HEADROOM_HOME")
    if home_env:
        home = Path(home_env).expanduser().absolute()
        config_file = home / "config.toml"
        data_dir = home
    else:
        import platformdirs  # only without HEADROOM_HOME: 30 ms off each command's start

        home = Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
        config_file = Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)) / "config.toml"
        data_dir = home
    if config_override:
        config_file = Path(config_override).expanduser().absolute()
    return Paths(
        home=home,
        config_file=config_file,
        data_dir=data_dir,
        runtime_dir=_runtime_dir_for(data_dir),
    )
