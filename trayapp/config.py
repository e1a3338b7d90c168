"""Settings and paths.

Every setting's default, type, limits and comment live in one table (``SETTINGS``). ``config.toml``
is hand-editable: a bad key or value gives a message that names it and the default is used for
that key; saving edits the user's file in place (comments kept) and never writes less than the
user wrote.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import reprlib
import stat
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from trayapp import private
from trayapp.text import one_line
from trayapp.vocab import GuardAct, GuardMode

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python < 3.11
    import tomli as tomllib

APP_NAME = "headroom"

# ---------------------------------------------------------------------------------------------
# Sizes and thresholds


class ConfigError(ValueError):
    """A value that cannot be used; the message names the problem in one line."""


class ConfigConflict(ConfigError):
    """The file changed since the caller read it; nothing was written."""


# A value in a message is shown cut short: a file may hold a megabyte string or a deep array.
_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 40
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxlong = 1, 3, 2, 30


def _shown(value: Any) -> str:
    return _SHOWN.repr(value)


def _named(key: Any) -> str:
    """A key from the file as it can be printed: one line, cut short."""
    return one_line(str(key), limit=60)


SIZE_MAX_BYTES = 2**63 - 1  # what the kernel and SQLite can count


class _TooLarge(ConfigError):
    pass


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: Any) -> int:
    """``"2 GiB"`` -> bytes. A bare number is bytes. Raises ConfigError on anything else."""
    if isinstance(text, bool):
        raise ConfigError(f"{text!r} is not a size")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ConfigError(f"{_shown(text)} is negative")
        return _bounded_size(text, text)
    m = _SIZE_RE.match(str(text)) if isinstance(text, str) else None
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ConfigError(f"{_shown(text)} is not a size like \"2048 MiB\" or \"2 GiB\"")
    return _bounded_size(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()], text)


def _bounded_size(n: float, text: Any) -> int:
    if not (isinstance(n, int) or math.isfinite(n)) or n > SIZE_MAX_BYTES:
        raise _TooLarge(f"{_shown(text)} is larger than any memory (8 EiB at most)")
    return int(n)


@dataclass(frozen=True)
class Threshold:
    """An amount of available memory, as a share of the total or as a size."""

    percent: Optional[float] = None
    size_bytes: Optional[int] = None

    @classmethod
    def parse(cls, value: Any) -> Threshold:
        text = value.strip() if isinstance(value, str) else ""
        if text.endswith("%"):
            try:
                pct = float(text[:-1])
            except ValueError:
                raise ConfigError(f"{_shown(value)} is not a percentage like \"15%\"") from None
            if not 0 <= pct <= 100:
                raise ConfigError(f"{_shown(value)} is not between 0% and 100%")
            return cls(percent=pct)
        try:
            return cls(size_bytes=parse_size(value))
        except _TooLarge:
            raise
        except ConfigError:
            raise ConfigError(
                f"{_shown(value)} is not a percentage like \"15%\" or a size like \"2 GiB\""
            ) from None

    def bytes_of(self, total_bytes: int) -> int:
        if self.percent is not None:
            return int(total_bytes * self.percent / 100.0)
        return int(self.size_bytes or 0)

    def __str__(self) -> str:
        if self.percent is not None:
            return f"{self.percent:g}%"
        return format_bytes(self.size_bytes or 0)


def format_bytes(n: Optional[float], digits: int = 1) -> str:
    """Human-readable bytes in binary units; ``None`` reads "n/a"."""
    if n is None:
        return "n/a"
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            if unit == "B":
                return f"{sign}{int(n)} B"
            return f"{sign}{n:.{digits}f} {unit}"
        n /= 1024
    return f"{sign}{n:.{digits}f} TiB"  # pragma: no cover


# ---------------------------------------------------------------------------------------------
# The table of settings


def _as_float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"{_shown(v)} is not a number")
    try:
        f = float(v)
    except OverflowError:
        f = math.inf
    if not math.isfinite(f):
        raise ConfigError(f"{_shown(v)} is not a finite number")
    return f


def _as_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{_shown(v)} is not a whole number")
    return v


def _as_bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{_shown(v)} is not true or false")
    return v


def _as_threshold(v: Any) -> Any:
    t = Threshold.parse(v)
    # A bare number is a size in bytes; keep it a number so it reads back the same.
    return v if isinstance(v, str) else t.size_bytes


def _choice(*options: str) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if not isinstance(v, str) or v not in options:
            raise ConfigError(f"{_shown(v)} is not one of {', '.join(options)}")
        return str(v)

    return check


@dataclass(frozen=True)
class Setting:
    section: str
    key: str
    default: Any
    convert: Callable[[Any], Any]
    comment: str
    minimum: Optional[float] = None
    maximum: Optional[float] = None

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}"

    def check(self, value: Any) -> Any:
        try:
            v = self.convert(value)
        except ConfigError:
            raise
        except (ArithmeticError, ValueError, TypeError, RecursionError):
            # A converter that meets a value it was not written for refuses it, never raises.
            raise ConfigError(f"{_shown(value)} cannot be used here") from None
        if self.minimum is not None and v < self.minimum:
            raise ConfigError(f"{_shown(value)} is below the minimum {self.minimum:g}")
        if self.maximum is not None and v > self.maximum:
            raise ConfigError(f"{_shown(value)} is above the maximum {self.maximum:g}")
        return v


SETTINGS: Tuple[Setting, ...] = (
    # [engine]
    Setting("engine", "sample_interval", 1.0, _as_float,
            "Seconds between samples while memory is calm; the guard samples faster (down to "
            "0.02 s) as headroom shrinks.", 0.02, 60),
    Setting("engine", "idle_exit_seconds", 60.0, _as_float,
            "Without --stay, the engine exits after this long with no clients and no jobs.",
            1, 86400),
    Setting("engine", "publish_hz", 4.0, _as_float,
            "Most snapshots a second sent to the tray and other subscribers.", 0.1, 10),
    # [history]
    Setting("history", "raw_hours", 24.0, _as_float,
            "Hours of every sample kept (at most one a second).", 1, 24 * 7),
    Setting("history", "keep_days", 30.0, _as_float,
            "Days of one-minute min/mean/max kept.", 1, 3650),
    # [guard]
    Setting("guard", "mode", GuardMode.ACT.value, _choice(*(m.value for m in GuardMode)),
            "act: warn, pause and park jobs; dry-run: record what it would do and do nothing; "
            "off: watch only."),
    Setting("guard", "warn_available", "15%", _as_threshold,
            "Warn when available memory falls below this (a share like \"15%\" or a size like "
            "\"2 GiB\")."),
    Setting("guard", "pause_available", "8%", _as_threshold,
            "Pause the guard's jobs when available memory falls below this."),
    Setting("guard", "park_available", "5%", _as_threshold,
            "Park (checkpoint and end) a job when available memory falls below this."),
    Setting("guard", "resume_available", "20%", _as_threshold,
            "Resume paused jobs when available memory is back above this."),
    Setting("guard", "warn_horizon_seconds", 60.0, _as_float,
            "Warn when memory is predicted to run out within this many seconds.", 0, 3600),
    Setting("guard", "pause_horizon_seconds", 10.0, _as_float,
            "Pause when memory is predicted to run out within this many seconds.", 0, 3600),
    Setting("guard", "psi_full_threshold", 20.0, _as_float,
            "Memory pressure: warn when PSI \"full avg10\" (percent of time all tasks stall on "
            "memory) stays above this...", 0, 100),
    Setting("guard", "psi_duration_seconds", 20.0, _as_float,
            "...for this many seconds.", 0, 3600),
    Setting("guard", "vram_warn_percent", 95.0, _as_float,
            "Warn when a GPU's memory use passes this percentage.", 1, 100),
    Setting("guard", "budget_warn_percent", 90.0, _as_float,
            "Warn when a job reaches this share of its RAM or VRAM budget (pause at 100%).",
            1, 100),
    Setting("guard", "pause_deadline_seconds", 2.0, _as_float,
            "How long a Keras job gets to pause at a batch end before it is suspended.", 0.05, 60),
    Setting("guard", "auto_resume", True, _as_bool,
            "Resume paused jobs by itself when memory is back (per job, overridable)."),
    Setting("guard", "resume_after_seconds", 10.0, _as_float,
            "Memory must stay above resume_available this long before an automatic resume.",
            0, 3600),
    Setting("guard", "cooldown_seconds", 30.0, _as_float,
            "After an automatic resume, wait this long before pausing the same job again "
            "for a predicted (not actual) shortage.", 0, 3600),
    Setting("guard", "stop_available", "2%", _as_threshold,
            "Last resort: stop a job (gracefully, then forced) when available memory falls "
            "below this and no job is left to pause or park."),
    Setting("guard", "hysteresis", "2%", _as_threshold,
            "A low-memory warning clears only once available memory is this far back above "
            "the warning threshold, so a reading that hovers at it does not flap."),
    Setting("guard", "psi_pause_threshold", 60.0, _as_float,
            "Memory pressure: pause the guard's jobs when PSI \"full avg10\" stays above this "
            "(systemd-oomd acts at 60% for 30 s; 100 turns it off)...", 0, 100),
    Setting("guard", "psi_pause_duration_seconds", 30.0, _as_float,
            "...for this many seconds.", 0, 3600),
    Setting("guard", "rate_window_seconds", 3.0, _as_float,
            "Seconds of recent samples the fill rate is fitted to (least squares): longer is "
            "steadier, shorter notices a change sooner.", 0.5, 60),
    # [jobs]
    Setting("jobs", "nice", 0, _as_int,
            "CPU priority of a job, as a nice value from 0 (the desktop's normal priority) to "
            "19 (the nicest): a job never runs above the desktop (Windows: above 0 is the "
            "below-normal priority class).", 0, 19),
    Setting("jobs", "oom_score_adj", 500, _as_int,
            "How readily the kernel's OOM killer picks a job, from 0 (like the desktop) to "
            "1000 (first): if the kernel must kill, it takes the training, which a checkpoint "
            "brings back, and not the desktop (Linux only).", 0, 1000),
    Setting("jobs", "log_max_mb", 32, _as_int,
            "Most MB of output a job's log keeps: past it, the first eighth and the last half "
            "are kept, with a line saying how much was dropped between them.", 1, 1024 * 1024),
    # [ui]
    Setting("ui", "notifications", True, _as_bool, "Show desktop notifications."),
    Setting("ui", "show_dashboard_at_start", False, _as_bool,
            "Open the dashboard when Headroom starts (otherwise only the tray icon)."),
    Setting("ui", "start_at_login", False, _as_bool, "Start Headroom when you log in."),
)

SETTINGS_BY_NAME: Dict[str, Setting] = {s.name: s for s in SETTINGS}
SECTIONS = tuple(dict.fromkeys(s.section for s in SETTINGS))
# What a [[guard.rules]] entry may do to the processes it names.
RULE_ACTS = (GuardAct.WARN.value, GuardAct.PAUSE.value, GuardAct.STOP.value)
# Sections holding lists or tables the flat table above does not describe.
FREE_FORM = {("guard", "rules")}


@dataclass
class Config:
    """Loaded settings: ``values["guard.mode"]``, plus the messages about what was wrong."""

    values: Dict[str, Any] = field(default_factory=lambda: {s.name: s.default for s in SETTINGS})
    rules: List[Dict[str, Any]] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    path: Optional[Path] = None
    # The file as it was read: its stat (to notice an edit cheaply), a digest of its bytes ("" for
    # no file; what a save compares against), and why it could not be read, if it could not.
    stamp: Optional[Tuple[int, ...]] = None
    version: str = ""
    read_error: Optional[str] = None

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def threshold(self, name: str) -> Threshold:
        return Threshold.parse(self.values[name])

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {sec: {} for sec in SECTIONS}
        for s in SETTINGS:
            out[s.section][s.key] = self.values[s.name]
        out["guard"]["rules"] = list(self.rules)
        return out


def _check_rules(raw: Any, problems: List[str]) -> List[Dict[str, Any]]:
    rules: List[Dict[str, Any]] = []
    if not isinstance(raw, list):
        problems.append("config: [[guard.rules]] must be a list of tables; ignored")
        return rules
    for i, r in enumerate(raw):
        if not isinstance(r, dict) or not isinstance(r.get("process"), str):
            problems.append(f"config: guard rule {i + 1} needs process = \"name pattern\"; ignored")
            continue
        action = r.get("action", GuardAct.WARN.value)
        if action not in RULE_ACTS:
            problems.append(f"config: guard rule {i + 1}: action {_shown(action)} is not warn, "
                            "pause or stop; ignored")
            continue
        rules.append({"process": r["process"], "action": action})
    return rules


def from_mapping(data: Dict[str, Any], path: Optional[Path] = None) -> Config:
    """Validate a parsed TOML mapping; every problem is a message and that key's default."""
    cfg = Config(path=path)
    for sec, table in data.items():
        if sec not in SECTIONS:
            cfg.problems.append(f"config: unknown section [{_named(sec)}]; ignored")
            continue
        if not isinstance(table, dict):
            cfg.problems.append(f"config: [{_named(sec)}] must be a table; using the defaults")
            continue
        for key, value in table.items():
            if (sec, key) in FREE_FORM:
                cfg.rules = _check_rules(value, cfg.problems)
                continue
            setting = SETTINGS_BY_NAME.get(f"{sec}.{key}")
            if setting is None:
                cfg.problems.append(f"config: unknown setting {_named(sec)}.{_named(key)}; ignored")
                continue
            try:
                cfg.values[setting.name] = setting.check(value)
            except ConfigError as e:
                cfg.problems.append(one_line(
                    f"config: {setting.name} = {_shown(value)}: {e}; "
                    f"using the default {setting.default!r}"
                ))
    _check_order(cfg)
    return cfg


def _check_order(cfg: Config) -> None:
    """The ladder's thresholds must nest; when they do not, say so (they still apply)."""
    ref = 16 * 1024**3
    try:
        park, pause, warn = (cfg.threshold(f"guard.{k}").bytes_of(ref)
                             for k in ("park_available", "pause_available", "warn_available"))
    except ConfigError:  # pragma: no cover - validated above
        return
    if not park <= pause <= warn:
        cfg.problems.append("config: guard thresholds should satisfy park <= pause <= warn")


CONFIG_MAX_BYTES = 1 << 20  # a settings file is a few KiB; more is not a settings file


def file_stamp(path: Path) -> Optional[Tuple[int, ...]]:
    """What changes when the file is edited or replaced (inode, size, mtime, ctime); None when
    it cannot be looked at. One stat: cheap enough for every slow tick."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_capped(path: Path) -> bytes:
    # Non-blocking, so a FIFO put in the file's place cannot hang the engine's tick.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ConfigError("it is not a regular file")
        data = f.read(CONFIG_MAX_BYTES + 1)
    if len(data) > CONFIG_MAX_BYTES:
        raise ConfigError(f"it is larger than {CONFIG_MAX_BYTES // 1024} KiB")
    return data


def file_version(path: Path) -> str:
    """A digest of the file's bytes, as ``Config.version`` has it ("" when there is none or it
    cannot be read)."""
    try:
        return _digest(_read_capped(path))
    except (OSError, ConfigError):
        return ""


def changed_since(cfg: Config) -> bool:
    """Whether ``cfg.path`` differs from what ``cfg`` was loaded from: its stat, and its bytes
    too while its mtime is within the clock's coarse tick of the load (an edit then may keep
    the same stamp)."""
    if cfg.path is None:
        return False
    stamp = file_stamp(cfg.path)
    if stamp != cfg.stamp:
        return True
    if stamp is not None and time.time_ns() - stamp[2] < 3 * 10**9:
        return file_version(cfg.path) != cfg.version
    return False


def load(path: Path) -> Config:
    """Read ``config.toml``; a missing file is the defaults, a broken one is the defaults and a
    message. Never raises."""
    stamp = file_stamp(path)  # before reading, so an edit during the read is seen next time
    if not path.exists():
        return Config(path=path, stamp=stamp)
    version = ""
    try:
        # A file another user owns or can write is not trusted: the engine refuses it at start,
        # and a reload takes it as a file that cannot be read.
        private.check_config(path, tighten_it=False)
        raw = _read_capped(path)
        version = _digest(raw)
        data = tomllib.loads(raw.decode("utf-8"))
        cfg = from_mapping(data, path)
    except (OSError, ValueError, RecursionError) as e:
        if isinstance(e, RecursionError):
            why = "nested too deeply"
        elif isinstance(e, private.UnsafePath):
            why = one_line(e)
        elif isinstance(e, OSError):
            why = one_line(e.strerror or e)
        else:
            why = one_line(e, limit=200)
        cfg = Config(path=path, read_error=why)
        cfg.problems.append(f"config: {path} cannot be read ({why}); using the defaults")
    cfg.stamp, cfg.version = stamp, version
    return cfg


def default_text() -> str:
    """A complete, commented ``config.toml`` holding every default."""
    import tomlkit

    doc = tomlkit.document()
    doc.add(tomlkit.comment("Headroom settings. Delete a line to get its default back."))
    for sec in SECTIONS:
        table = tomlkit.table()
        for s in SETTINGS:
            if s.section != sec:
                continue
            table.add(tomlkit.comment(s.comment))
            table.add(s.key, s.default)
        if sec == "guard":
            table.add(tomlkit.comment(
                "Rules for processes Headroom did not start, e.g.\n"
                "# [[guard.rules]]\n# process = \"chrome*\"\n"
                "# action = \"warn\"   # warn | pause | stop"
            ))
        doc.add(sec, table)
    return tomlkit.dumps(doc)


def save_value(path: Path, name: str, value: Any, version: Optional[str] = None) -> Any:
    """Set one setting in the user's file (comments and other keys kept), atomically.

    Returns the converted value. Raises ConfigError for an unknown name or a bad value, and
    ConfigConflict when ``version`` is given and the file's bytes are no longer those it names
    (a hand edit the caller has not seen); nothing is written then. A file that cannot be parsed
    is moved aside (its name gets the time) first.
    """
    import tomlkit

    setting = SETTINGS_BY_NAME.get(name) if isinstance(name, str) else None
    if setting is None:
        raise ConfigError(f"unknown setting {_named(name)}")
    checked = setting.check(value)
    raw: Optional[bytes] = None
    try:
        raw = _read_capped(path)  # read once: what is compared is what is edited
    except (OSError, ConfigError):
        pass
    if version is not None and (_digest(raw) if raw is not None else "") != version:
        raise ConfigConflict(f"{path} changed since these settings were read; nothing was saved")
    doc: Any
    if path.exists():
        try:
            if raw is None:
                raise ConfigError("cannot be read")
            doc = tomlkit.parse(raw.decode("utf-8"))
        except Exception:  # tomlkit raises several types for broken files
            aside = path.with_name(f"{path.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}")
            os.replace(path, aside)
            doc = tomlkit.parse(default_text())
    else:
        doc = tomlkit.parse(default_text())
    if setting.section not in doc or not isinstance(doc[setting.section], dict):
        doc[setting.section] = tomlkit.table()
    doc[setting.section][setting.key] = checked
    atomic_write(path, tomlkit.dumps(doc))
    return checked


def atomic_write(path: Path, text: str, mode: int = 0o600) -> None:
    """Write ``text`` to ``path`` through a temporary file, so a crash leaves the old file."""
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp makes a new file (O_EXCL, no link followed), 0600, so a key is never readable by
    # others, even briefly; the rename replaces whatever is at ``path``, a link included,
    # without writing through it.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            if hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# ---------------------------------------------------------------------------------------------
# Paths


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
        private.ensure_state(self.home, self.data_dir, self.config_file, self.jobs_dir,
                             self.runtime_dir)


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
        import platformdirs

        home = Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
        config_file = Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)) / "config.toml"
        data_dir = home
    if config_override:
        config_file = Path(config_override).expanduser().absolute()
    return Paths(home=home, config_file=config_file, data_dir=data_dir,
                 runtime_dir=_runtime_dir_for(data_dir))
