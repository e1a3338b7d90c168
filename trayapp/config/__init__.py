"""Settings and paths.

Every setting's default, type, limits and comment live in one table (``SETTINGS``, in
``table.py``). ``config.toml`` is hand-editable: a bad key or value gives a message that names it
and the default is used for that key; saving edits the user's file in place (comments kept) and
never writes less than the user wrote. Sizes and thresholds are in ``sizes.py``, the state's
paths in ``paths.py``; their names are importable from here too.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from trayapp import private
from trayapp.config.paths import APP_NAME as APP_NAME
from trayapp.config.paths import Paths as Paths
from trayapp.config.paths import ensure_private_dir as ensure_private_dir
from trayapp.config.paths import get_paths as get_paths
from trayapp.config.sizes import SIZE_MAX_BYTES as SIZE_MAX_BYTES
from trayapp.config.sizes import ConfigConflict as ConfigConflict
from trayapp.config.sizes import ConfigError as ConfigError
from trayapp.config.sizes import Threshold as Threshold
from trayapp.config.sizes import _named, _shown
from trayapp.config.sizes import parse_size as parse_size
from trayapp.config.table import FREE_FORM, RULE_ACTS
from trayapp.config.table import GUARD_SETTINGS as GUARD_SETTINGS
from trayapp.config.table import SECTIONS as SECTIONS
from trayapp.config.table import SETTINGS as SETTINGS
from trayapp.config.table import SETTINGS_BY_NAME as SETTINGS_BY_NAME
from trayapp.config.table import Setting as Setting
from trayapp.formats import format_bytes as format_bytes
from trayapp.jsonvalue import JSONObject
from trayapp.text import one_line
from trayapp.vocab import GuardAct

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python < 3.11
    import tomli as tomllib


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

    def to_json(self) -> JSONObject:
        out: Dict[str, JSONObject] = {sec: {} for sec in SECTIONS}
        for s in SETTINGS:
            out[s.section][s.key] = self.values[s.name]
        out["guard"]["rules"] = list(self.rules)
        return dict(out)


def _check_rules(raw: Any, problems: List[str]) -> List[Dict[str, Any]]:
    rules: List[Dict[str, Any]] = []
    if not isinstance(raw, list):
        problems.append("config: [[guard.rules]] must be a list of tables; ignored")
        return rules
    for i, r in enumerate(raw):
        if not isinstance(r, dict) or not isinstance(r.get("process"), str):
            problems.append(f'config: guard rule {i + 1} needs process = "name pattern"; ignored')
            continue
        action = r.get("action", GuardAct.WARN.value)
        if action not in RULE_ACTS:
            problems.append(
                f"config: guard rule {i + 1}: action {_shown(action)} is not warn, "
                "pause or stop; ignored"
            )
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
                cfg.problems.append(
                    one_line(
                        f"config: {setting.name} = {_shown(value)}: {e}; "
                        f"using the default {setting.default!r}"
                    )
                )
    _check_order(cfg)
    _check_tls(cfg)
    return cfg


def _check_order(cfg: Config) -> None:
    """The ladder's thresholds must nest; when they do not, say so (they still apply)."""
    ref = 16 * 1024**3
    try:
        park, pause, warn = (
            cfg.threshold(f"guard.{k}").bytes_of(ref)
            for k in ("park_available", "pause_available", "warn_available")
        )
    except ConfigError:  # pragma: no cover - validated above
        return
    if not park <= pause <= warn:
        cfg.problems.append("config: guard thresholds should satisfy park <= pause <= warn")


def _check_tls(cfg: Config) -> None:
    """A certificate needs its key and a key its certificate; the exporter does not fall back
    to plain HTTP, it stays off (and says so)."""
    cert, key = cfg.values["metrics.tls_cert"], cfg.values["metrics.tls_key"]
    if bool(cert) != bool(key):
        given, missing = ("tls_cert", "tls_key") if cert else ("tls_key", "tls_cert")
        cfg.problems.append(
            f"config: metrics.{given} is set but metrics.{missing} is not; "
            "the metrics exporter stays off until both are"
        )


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
    import tomlkit  # only to write the file: loading it (every start) needs tomllib only

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
            table.add(
                tomlkit.comment(
                    "Rules for processes Headroom did not start, e.g.\n"
                    '# [[guard.rules]]\n# process = "chrome*"\n'
                    '# action = "warn"   # warn | pause | stop'
                )
            )
        doc.add(sec, table)
    return tomlkit.dumps(doc)


def save_value(path: Path, name: str, value: Any, version: Optional[str] = None) -> Any:
    """Set one setting in the user's file (comments and other keys kept), atomically.

    Returns the converted value. Raises ConfigError for an unknown name or a bad value, and
    ConfigConflict when ``version`` is given and the file's bytes are no longer those it names
    (a hand edit the caller has not seen); nothing is written then. A file that cannot be parsed
    is moved aside (its name gets the time) first.
    """
    import tomlkit  # only to write the file: loading it (every start) needs tomllib only

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
