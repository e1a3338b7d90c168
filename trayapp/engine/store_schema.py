"""The store's database file: its schema and the migrations between versions, opening it
(checked and migrated), moving an unusable one aside, and telling an error that says the file is
broken from one that says "try again later".

The format is the one every Headroom since the first wrote: ``MIGRATIONS[i]`` takes a database
from version i to i + 1 inside one transaction; never edit a released step, add a new one.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional

from trayapp import private, vocab
from trayapp.text import one_line

log = logging.getLogger("headroom.store")

# A database error's text, as far as it goes into a log line or a stored event.
REASON_CHARS = 300
# Jobs in this state keep their record although their process has ended: they can be resumed.
RESUMABLE_STATES = vocab.PARKED

BUSY_TIMEOUT_SECONDS = 5.0
# SQLite primary result codes that say "try again later", not "this file is broken":
# PERM, BUSY, LOCKED, NOMEM, READONLY, INTERRUPT, IOERR, FULL, CANTOPEN.
TRANSIENT_CODES = frozenset({3, 5, 6, 7, 8, 9, 10, 13, 14})
TRANSIENT_WORDS = (
    "locked",
    "busy",
    "full",
    "disk i/o",
    "unable to open",
    "readonly",
    "read-only",
    "permission",
    "out of memory",
    "interrupted",
)
CORRUPT_CODES = frozenset({11, 26})  # CORRUPT, NOTADB


def _migrate_1(conn: sqlite3.Connection) -> None:
    for sql in (
        "CREATE TABLE schema_version (version INTEGER NOT NULL)",
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)",
        "CREATE TABLE series (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE)",
        "CREATE TABLE samples (series_id INTEGER NOT NULL, t REAL NOT NULL, v REAL NOT NULL,"
        " PRIMARY KEY (series_id, t)) WITHOUT ROWID",
        "CREATE TABLE minutes (series_id INTEGER NOT NULL, m INTEGER NOT NULL,"
        " vmin REAL NOT NULL, vmean REAL NOT NULL, vmax REAL NOT NULL, n INTEGER NOT NULL,"
        " PRIMARY KEY (series_id, m)) WITHOUT ROWID",
        "CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL,"
        " kind TEXT NOT NULL, level TEXT NOT NULL, message TEXT NOT NULL, job_id TEXT,"
        " data TEXT)",
        "CREATE INDEX events_time ON events (time)",
        "CREATE TABLE jobs (id TEXT PRIMARY KEY, name TEXT, state TEXT, started REAL,"
        " data TEXT NOT NULL)",
        "CREATE INDEX jobs_started ON jobs (started)",
    ):
        conn.execute(sql)


def _migrate_2(conn: sqlite3.Connection) -> None:
    # Retention must know which jobs are over and since when without parsing every job's JSON.
    conn.execute("ALTER TABLE jobs ADD COLUMN ended REAL")
    conn.execute("ALTER TABLE jobs ADD COLUMN finished INTEGER NOT NULL DEFAULT 0")
    rows = conn.execute("SELECT id, data FROM jobs").fetchall()
    for job_id, data in rows:
        try:
            job = json.loads(data)
        except ValueError:
            continue
        if isinstance(job, dict):
            conn.execute(
                "UPDATE jobs SET ended = ?, finished = ? WHERE id = ?",
                (number(job.get("ended")), int(is_finished(job)), job_id),
            )
    conn.execute("CREATE INDEX jobs_finished ON jobs (finished, ended)")
    conn.execute("CREATE INDEX events_job ON events (job_id, id)")


MIGRATIONS: List[Callable[[sqlite3.Connection], None]] = [_migrate_1, _migrate_2]
SCHEMA_VERSION = len(MIGRATIONS)

# What the code reads and writes; a database that lacks any of these is unusable.
EXPECTED_COLUMNS = {
    "schema_version": "version",
    "meta": "key, value",
    "series": "id, name",
    "samples": "series_id, t, v",
    "minutes": "series_id, m, vmin, vmean, vmax, n",
    "events": "id, time, kind, level, message, job_id, data",
    "jobs": "id, name, state, started, ended, finished, data",
}


class Unusable(Exception):
    """The file opens but cannot be used: corrupt, a schema that does not match, or newer."""

    def __init__(self, reason: str, tag: str = "corrupt") -> None:
        super().__init__(reason)
        self.tag = tag


def make_private(path: Path, create: bool = True) -> None:
    """The database file (created when missing, with ``create``) the user's own and 0600,
    reached without following a link; SQLite then opens what is there. A link or another
    user's file is unusable (moved aside: the rename moves the link, not what it points to)."""
    try:
        if create:
            os.close(private.open_private(path, os.O_RDWR | os.O_CREAT))
        else:
            private.tighten(path)
    except private.UnsafePath as e:
        raise Unusable(str(e), tag="unsafe") from None


def number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def is_finished(job: Mapping[str, object]) -> bool:
    return job.get("ended") is not None and job.get("state") not in RESUMABLE_STATES


def error_code(e: BaseException) -> Optional[int]:
    code = getattr(e, "sqlite_errorcode", None)  # Python >= 3.11
    return None if code is None else int(code) & 0xFF


def is_transient(e: BaseException) -> bool:
    """True for errors that say nothing about the file itself (locked, full, I/O, no access)."""
    if isinstance(e, OSError):
        return True
    code = error_code(e)
    if code is not None:
        return code in TRANSIENT_CODES
    text = str(e).lower()
    return any(word in text for word in TRANSIENT_WORDS)


def is_corrupt(e: BaseException) -> bool:
    code = error_code(e)
    if code is not None:
        return code in CORRUPT_CODES
    text = str(e).lower()
    return "malformed" in text or "not a database" in text


def connect(path: Path) -> sqlite3.Connection:
    """A ready connection: WAL, checked, migrated. Raises sqlite3.Error, OSError, Unusable."""
    memory = str(path) == ":memory:"
    if not memory:
        path.parent.mkdir(parents=True, exist_ok=True)
        make_private(path)
    conn = sqlite3.connect(
        str(path),
        timeout=BUSY_TIMEOUT_SECONDS,
        isolation_level=None,
        check_same_thread=False,
    )
    try:
        if not memory:
            conn.execute("PRAGMA journal_mode=WAL").fetchone()
            conn.execute("PRAGMA synchronous=NORMAL")
            for suffix in ("-wal", "-shm"):
                make_private(Path(f"{path}{suffix}"), create=False)
        check = conn.execute("PRAGMA quick_check(1)").fetchone()
        if not check or check[0] != "ok":
            raise Unusable(f"integrity check: {check[0] if check else 'no answer'}")
        migrate(conn, path)
        for table, columns in EXPECTED_COLUMNS.items():
            try:
                conn.execute(f"SELECT {columns} FROM {table} LIMIT 0")
            except sqlite3.OperationalError as e:
                raise Unusable(f"schema does not match: {one_line(e, REASON_CHARS)}") from None
    except BaseException:
        conn.close()
        raise
    return conn


def schema_version(conn: sqlite3.Connection) -> int:
    known = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    ).fetchone()
    if not known:
        return 0
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    try:
        return int(row[0] or 0)
    except (TypeError, ValueError):
        raise Unusable(f"schema version {row[0]!r} is not a number") from None


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    version = schema_version(conn)
    if version > SCHEMA_VERSION:
        raise Unusable(
            f"made by a newer Headroom (schema {version}, this one knows {SCHEMA_VERSION})",
            tag="newer",
        )
    while version < SCHEMA_VERSION:
        conn.execute("BEGIN IMMEDIATE")
        try:
            MIGRATIONS[version](conn)
            conn.execute("DELETE FROM schema_version")
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version + 1,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        version += 1
        log.info("history database %s is now at schema version %d", path, version)


def move_aside(path: Path, tag: str) -> Optional[Path]:
    """Rename the database and its WAL to ``<name>.<tag>-YYYYmmdd-HHMMSS``; None on failure."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.{tag}-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.{tag}-{stamp}-{n}")
    try:
        os.replace(path, target)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.error("cannot move %s aside: %s", path, one_line(e, REASON_CHARS))
        return None
    for suffix in ("-wal", "-journal"):
        side = Path(f"{path}{suffix}")
        try:
            if side.exists():
                os.replace(side, Path(f"{target}{suffix}"))
        except OSError as e:
            log.warning("cannot move %s aside: %s", side, one_line(e, REASON_CHARS))
    try:
        Path(f"{path}-shm").unlink()
    except OSError:
        pass
    return target


def loads(text: Optional[str]) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def limit(value: Any, default: int) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError, OverflowError):
        return default
