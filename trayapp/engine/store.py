"""The engine's SQLite store: memory history in two tiers, events and jobs.

One file (``headroom.db``, WAL). History is a generic series model: a sample is a time and a
dict of ``{series name: value}``; names map to small integer ids. Raw samples (at most one a
second per series) are kept for ``raw_hours``; one-minute min/mean/max for ``keep_days``.
Samples are buffered in memory and written by ``flush()``, which the engine calls every few
seconds; roll-up and retention run from ``flush()`` about once a minute.

The store never raises a database error to its caller: a corrupt file is moved aside and a new
one made, a full disk keeps a bounded buffer and sets ``write_error``, and failed reads log and
return what they can. The engine loop writes; control-channel threads read. One connection,
guarded by a lock, serves both; samples are buffered under a second lock so ``add_sample`` never
waits for a slow read.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

from trayapp import private, vocab
from trayapp.text import one_line
from trayapp.vocab import EventKind as E

log = logging.getLogger("headroom.store")

# A database error's text, as far as it goes into a log line or a stored event.
REASON_CHARS = 300

# Ranges up to this long are answered from raw samples (when the raw tier still covers them).
RAW_QUERY_MAX_SECONDS = 6 * 3600.0
# A sample closer than this to the last one kept for its series is dropped.
MIN_SAMPLE_SPACING_SECONDS = 1.0
MAINTENANCE_INTERVAL_SECONDS = 60.0
# Jobs in this state keep their record although their process has ended: they can be resumed.
RESUMABLE_STATES = vocab.PARKED

_BUSY_TIMEOUT_SECONDS = 5.0
_MAX_PENDING_EVENTS = 1000
# SQLite primary result codes that say "try again later", not "this file is broken":
# PERM, BUSY, LOCKED, NOMEM, READONLY, INTERRUPT, IOERR, FULL, CANTOPEN.
_TRANSIENT_CODES = frozenset({3, 5, 6, 7, 8, 9, 10, 13, 14})
_TRANSIENT_WORDS = (
    "locked", "busy", "full", "disk i/o", "unable to open", "readonly", "read-only",
    "permission", "out of memory", "interrupted",
)
_CORRUPT_CODES = frozenset({11, 26})  # CORRUPT, NOTADB


# ---------------------------------------------------------------------------------------------
# Schema and migrations. MIGRATIONS[i] takes a database from version i to version i + 1 inside
# one transaction; never edit a released step, add a new one.


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
                (_number(job.get("ended")), int(_is_finished(job)), job_id),
            )
    conn.execute("CREATE INDEX jobs_finished ON jobs (finished, ended)")
    conn.execute("CREATE INDEX events_job ON events (job_id, id)")


MIGRATIONS: List[Callable[[sqlite3.Connection], None]] = [_migrate_1, _migrate_2]
SCHEMA_VERSION = len(MIGRATIONS)

# What the code reads and writes; a database that lacks any of these is unusable.
_EXPECTED_COLUMNS = {
    "schema_version": "version",
    "meta": "key, value",
    "series": "id, name",
    "samples": "series_id, t, v",
    "minutes": "series_id, m, vmin, vmean, vmax, n",
    "events": "id, time, kind, level, message, job_id, data",
    "jobs": "id, name, state, started, ended, finished, data",
}


class _Unusable(Exception):
    """The file opens but cannot be used: corrupt, a schema that does not match, or newer."""

    def __init__(self, reason: str, tag: str = "corrupt") -> None:
        super().__init__(reason)
        self.tag = tag


def _make_private(path: Path, create: bool = True) -> None:
    """The database file (created when missing, with ``create``) the user's own and 0600,
    reached without following a link; SQLite then opens what is there. A link or another
    user's file is unusable (moved aside: the rename moves the link, not what it points to)."""
    try:
        if create:
            os.close(private.open_private(path, os.O_RDWR | os.O_CREAT))
        else:
            private.tighten(path)
    except private.UnsafePath as e:
        raise _Unusable(str(e), tag="unsafe") from None


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _is_finished(job: Dict[str, Any]) -> bool:
    return job.get("ended") is not None and job.get("state") not in RESUMABLE_STATES


def _error_code(e: BaseException) -> Optional[int]:
    code = getattr(e, "sqlite_errorcode", None)  # Python >= 3.11
    return None if code is None else int(code) & 0xFF


def _is_transient(e: BaseException) -> bool:
    """True for errors that say nothing about the file itself (locked, full, I/O, no access)."""
    if isinstance(e, OSError):
        return True
    code = _error_code(e)
    if code is not None:
        return code in _TRANSIENT_CODES
    text = str(e).lower()
    return any(word in text for word in _TRANSIENT_WORDS)


def _is_corrupt(e: BaseException) -> bool:
    code = _error_code(e)
    if code is not None:
        return code in _CORRUPT_CODES
    text = str(e).lower()
    return "malformed" in text or "not a database" in text


Row = Tuple[str, float, float]  # series name, time, value


class Store:
    """History, events and jobs in one SQLite file. See the module docstring."""

    # Most samples (one value of one series) held in memory while the disk refuses writes;
    # the oldest go first. About an hour of fifteen series at 1 Hz.
    max_buffered_rows = 54_000

    def __init__(
        self,
        path: Path,
        *,
        raw_hours: float = 24,
        keep_days: float = 30,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Open or create the database at ``path``; never raises a database error.

        A corrupt or unusable file is moved aside (``recovered_from`` names where it went) and
        a new one made. When no file can be used at all (no access, disk full) the store keeps
        its data in memory only and says so in ``write_error``.
        """
        self.path = Path(path)
        self.raw_seconds = float(raw_hours) * 3600.0
        self.keep_seconds = float(keep_days) * 86400.0
        self._clock = clock
        self.recovered_from: Optional[Path] = None
        self.write_error: Optional[str] = None
        # Set when only an in-memory database could be opened: writes "work" but do not last.
        self._fallback_reason: Optional[str] = None

        self._lock = threading.RLock()  # the connection and everything below it
        self._buf_lock = threading.Lock()  # _buf and _last_t
        self._buf: List[Row] = []
        self._last_t: Dict[str, float] = {}
        self._dropped = 0
        self._pending_events: List[Dict[str, Any]] = []
        self._ids: Dict[str, int] = {}
        self._rolled_until = 0  # minutes below this index are in the minutes table
        self._last_maintenance: Optional[float] = None
        self._logged: Set[str] = set()
        self._conn: Optional[sqlite3.Connection] = None

        with self._lock:
            self._open()

    # -----------------------------------------------------------------------------------------
    # Opening, recovery

    def _open(self) -> None:
        try:
            self._conn = self._connect(self.path)
        except _Unusable as e:
            self._start_over(str(e), e.tag)
        except (sqlite3.Error, OSError) as e:
            if _is_transient(e):
                self._use_memory(f"cannot open {self.path}: {one_line(e, REASON_CHARS)}")
            else:
                self._start_over(one_line(e, REASON_CHARS), "corrupt")
        else:
            self._load_state()

    def _start_over(self, reason: str, tag: str) -> None:
        """Move the unusable file aside, make a new one and record an event saying so."""
        moved = self._move_aside(tag)
        if moved is None:
            self._use_memory(f"{self.path} is unusable ({reason}) and could not be moved aside")
            return
        log.warning("%s was unusable (%s); moved it aside to %s", self.path, reason, moved)
        self.recovered_from = moved
        try:
            self._conn = self._connect(self.path)
        except (sqlite3.Error, OSError, _Unusable) as e:
            self._use_memory(f"cannot create {self.path}: {one_line(e, REASON_CHARS)}")
        else:
            self._load_state()
        self.add_event(
            E.STORE_RECOVERED,
            f"The history database was unusable ({reason}); moved it aside to {moved} "
            "and started a new one.",
            level="warn",
            data={"moved_to": str(moved), "reason": reason},
        )

    def _connect(self, path: Path) -> sqlite3.Connection:
        """A ready connection: WAL, checked, migrated. Raises sqlite3.Error, OSError, _Unusable."""
        memory = str(path) == ":memory:"
        if not memory:
            path.parent.mkdir(parents=True, exist_ok=True)
            _make_private(path)
        conn = sqlite3.connect(
            str(path), timeout=_BUSY_TIMEOUT_SECONDS, isolation_level=None,
            check_same_thread=False,
        )
        try:
            if not memory:
                conn.execute("PRAGMA journal_mode=WAL").fetchone()
                conn.execute("PRAGMA synchronous=NORMAL")
                for suffix in ("-wal", "-shm"):
                    _make_private(Path(f"{path}{suffix}"), create=False)
            check = conn.execute("PRAGMA quick_check(1)").fetchone()
            if not check or check[0] != "ok":
                raise _Unusable(f"integrity check: {check[0] if check else 'no answer'}")
            self._migrate(conn)
            for table, columns in _EXPECTED_COLUMNS.items():
                try:
                    conn.execute(f"SELECT {columns} FROM {table} LIMIT 0")
                except sqlite3.OperationalError as e:
                    raise _Unusable(f"schema does not match: {one_line(e, REASON_CHARS)}") from None
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _schema_version(conn: sqlite3.Connection) -> int:
        known = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
        ).fetchone()
        if not known:
            return 0
        row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        try:
            return int(row[0] or 0)
        except (TypeError, ValueError):
            raise _Unusable(f"schema version {row[0]!r} is not a number") from None

    def _migrate(self, conn: sqlite3.Connection) -> None:
        version = self._schema_version(conn)
        if version > SCHEMA_VERSION:
            raise _Unusable(
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
            log.info("history database %s is now at schema version %d", self.path, version)

    def _move_aside(self, tag: str) -> Optional[Path]:
        """Rename the database and its WAL to ``<name>.<tag>-YYYYmmdd-HHMMSS``; None on failure."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = self.path.with_name(f"{self.path.name}.{tag}-{stamp}")
        n = 1
        while target.exists():
            n += 1
            target = self.path.with_name(f"{self.path.name}.{tag}-{stamp}-{n}")
        try:
            os.replace(self.path, target)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.error("cannot move %s aside: %s", self.path, one_line(e, REASON_CHARS))
            return None
        for suffix in ("-wal", "-journal"):
            side = Path(f"{self.path}{suffix}")
            try:
                if side.exists():
                    os.replace(side, Path(f"{target}{suffix}"))
            except OSError as e:
                log.warning("cannot move %s aside: %s", side, one_line(e, REASON_CHARS))
        try:
            Path(f"{self.path}-shm").unlink()
        except OSError:
            pass
        return target

    def _use_memory(self, reason: str) -> None:
        log.error("%s; history is kept in memory only until the engine restarts", reason)
        self._fallback_reason = f"{reason} (history kept in memory only)"
        self.write_error = self._fallback_reason
        try:
            self._conn = self._connect(Path(":memory:"))
        except (sqlite3.Error, _Unusable) as e:  # pragma: no cover - needs a broken sqlite3
            log.error("cannot open an in-memory database either: %s", one_line(e, REASON_CHARS))
            self._conn = None
        self._load_state()

    def _load_state(self) -> None:
        self._ids = {}
        self._rolled_until = 0
        conn = self._conn
        if conn is None:
            return
        try:
            self._ids = {name: sid for sid, name in conn.execute("SELECT id, name FROM series")}
            row = conn.execute("SELECT value FROM meta WHERE key = 'rolled_until'").fetchone()
            self._rolled_until = int(row[0]) if row else 0
            last = {}
            for name, sid in self._ids.items():
                r = conn.execute("SELECT MAX(t) FROM samples WHERE series_id = ?", (sid,))
                t = r.fetchone()[0]
                if t is not None:
                    last[name] = float(t)
            with self._buf_lock:
                for name, t in last.items():
                    self._last_t[name] = max(t, self._last_t.get(name, t))
        except (sqlite3.Error, ValueError) as e:
            self._read_failed("load", e)

    def _recover_at_runtime(self, e: BaseException) -> None:
        """A file that went corrupt while open: move it aside and carry on with a new one."""
        if self._conn is None or self._fallback_reason is not None:
            return
        try:
            self._conn.close()
        except sqlite3.Error:
            pass
        self._conn = None
        self._logged.clear()
        self._start_over(one_line(e, REASON_CHARS), "corrupt")

    # -----------------------------------------------------------------------------------------
    # Error reporting

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise sqlite3.ProgrammingError("the store is closed")
        return self._conn

    def _log_once(self, key: str, message: str, *args: Any) -> None:
        if key in self._logged:
            return
        if len(self._logged) > 100:
            self._logged.clear()
        self._logged.add(key)
        log.error(message, *args)

    def _read_failed(self, what: str, e: BaseException) -> None:
        self._log_once(f"read:{what}:{e}", "history database: %s failed: %s", what,
                       one_line(e, REASON_CHARS))
        if isinstance(e, sqlite3.DatabaseError) and _is_corrupt(e):
            self._recover_at_runtime(e)

    def _write_failed(self, what: str, e: BaseException) -> None:
        # Logged when writes start failing, not on every flush while they keep failing.
        if self.write_error is None or self.write_error == self._fallback_reason:
            log.error("cannot write %s to %s: %s", what, self.path, one_line(e, REASON_CHARS))
        self.write_error = f"cannot write {what} to {self.path}: {one_line(e, REASON_CHARS)}"
        if isinstance(e, sqlite3.DatabaseError) and _is_corrupt(e):
            self._recover_at_runtime(e)

    def _write_ok(self) -> None:
        """Called after history was written: the disk takes writes again."""
        if self.write_error is not None and self.write_error != self._fallback_reason:
            log.warning("history database %s takes writes again", self.path)
            if self._dropped:
                log.warning("%d samples were dropped while it could not", self._dropped)
        self._dropped = 0
        self.write_error = self._fallback_reason

    def _rollback(self) -> None:
        try:
            conn = self._conn
            if conn is not None and conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass

    # -----------------------------------------------------------------------------------------
    # Samples

    def add_sample(self, t: float, values: Dict[str, Optional[float]]) -> None:
        """Buffer one reading; ``flush()`` writes it. None, NaN and non-numbers are skipped,
        as is a value closer than one second to the last one kept for its series."""
        try:
            t = float(t)
        except (TypeError, ValueError):
            return
        if not math.isfinite(t) or not isinstance(values, dict):
            return
        rows: List[Row] = []
        with self._buf_lock:
            for name, value in values.items():
                if value is None or not isinstance(name, str) or not name:
                    continue
                try:
                    v = float(value)
                except (TypeError, ValueError):
                    continue
                if not math.isfinite(v):
                    continue
                last = self._last_t.get(name)
                # abs(): a clock stepped back still records, rather than going silent.
                if last is not None and abs(t - last) < MIN_SAMPLE_SPACING_SECONDS:
                    continue
                self._last_t[name] = t
                rows.append((name, t, v))
            self._buf.extend(rows)
            self._trim_buffer()

    def _trim_buffer(self) -> None:
        excess = len(self._buf) - self.max_buffered_rows
        if excess > 0:
            del self._buf[:excess]
            self._dropped += excess

    def flush(self) -> None:
        """Write buffered samples and unwritten events; about once a minute also roll up
        completed minutes and drop what is past retention. Never raises: on a write error the
        samples stay buffered (the oldest dropped beyond ``max_buffered_rows``) and
        ``write_error`` says why until a write succeeds."""
        with self._lock:
            if self._conn is None:
                return
            with self._buf_lock:
                pending, self._buf = self._buf, []
            wrote = False
            if pending or self._pending_events:
                try:
                    self._write_rows(pending)
                except (sqlite3.Error, OSError) as e:
                    self._rollback()
                    with self._buf_lock:
                        self._buf[:0] = pending
                        self._trim_buffer()
                    self._write_failed("history", e)
                    return
                wrote = True
            now = self._clock()
            last = self._last_maintenance
            if last is None or now - last >= MAINTENANCE_INTERVAL_SECONDS or now < last:
                try:
                    self._maintain(now)
                except (sqlite3.Error, OSError) as e:
                    self._rollback()
                    self._write_failed("the minute roll-up", e)
                    return
                self._last_maintenance = now
                wrote = True
            # Cleared only when every step worked, so a failing step is not logged each time.
            if wrote:
                self._write_ok()

    def _write_rows(self, rows: List[Row]) -> None:
        conn = self._db()
        new_ids: Dict[str, int] = {}
        conn.execute("BEGIN IMMEDIATE")
        for name in {r[0] for r in rows} - self._ids.keys():
            conn.execute("INSERT OR IGNORE INTO series (name) VALUES (?)", (name,))
            new_ids[name] = conn.execute(
                "SELECT id FROM series WHERE name = ?", (name,)
            ).fetchone()[0]
        ids = {**self._ids, **new_ids}
        conn.executemany(
            "INSERT OR REPLACE INTO samples (series_id, t, v) VALUES (?, ?, ?)",
            [(ids[name], t, v) for name, t, v in rows],
        )
        # A sample that arrives for a minute already rolled up (a clock stepped back) re-rolls
        # that minute, so the minute tier never disagrees with the raw one.
        raw_cutoff = self._clock() - self.raw_seconds
        late = {
            math.floor(t / 60.0) for _, t, _ in rows
            if raw_cutoff <= t < self._rolled_until * 60.0
        }
        for m in late:
            self._roll_up(conn, m, m + 1)
        written: List[int] = []
        for event in self._pending_events:
            written.append(self._insert_event(conn, event))
        conn.execute("COMMIT")
        self._ids.update(new_ids)
        for event, event_id in zip(self._pending_events, written):
            event["id"] = event_id
        self._pending_events = []

    @staticmethod
    def _roll_up(conn: sqlite3.Connection, m_from: int, m_to: int) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO minutes (series_id, m, vmin, vmean, vmax, n)"
            " SELECT series_id, CAST(t / 60 AS INTEGER), MIN(v), AVG(v), MAX(v), COUNT(*)"
            " FROM samples WHERE series_id IN (SELECT id FROM series) AND t >= ? AND t < ?"
            " GROUP BY series_id, CAST(t / 60 AS INTEGER)",
            (m_from * 60.0, m_to * 60.0),
        )

    def _maintain(self, now: float) -> None:
        conn = self._db()
        rolled = max(self._rolled_until, 0)
        done = math.floor(now / 60.0)  # minutes before this one are complete
        raw_cutoff = now - self.raw_seconds
        keep_cutoff = now - self.keep_seconds
        conn.execute("BEGIN IMMEDIATE")
        if done > rolled:
            if rolled == 0:
                first = conn.execute(
                    "SELECT MIN(t) FROM samples WHERE series_id IN (SELECT id FROM series)"
                ).fetchone()[0]
                rolled = math.floor(first / 60.0) if first is not None else done
            self._roll_up(conn, rolled, done)
            conn.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('rolled_until', ?)", (str(done),)
            )
        conn.execute(
            "DELETE FROM samples WHERE series_id IN (SELECT id FROM series) AND t < ?",
            (raw_cutoff,),
        )
        conn.execute(
            "DELETE FROM minutes WHERE series_id IN (SELECT id FROM series) AND m < ?",
            (keep_cutoff / 60.0,),
        )
        conn.execute("DELETE FROM events WHERE time < ?", (keep_cutoff,))
        conn.execute(
            "DELETE FROM jobs WHERE finished = 1 AND COALESCE(ended, started, 0) < ?",
            (keep_cutoff,),
        )
        # Series that left no data behind (a job's series long after it ended) go too.
        gone = conn.execute(
            "DELETE FROM series WHERE NOT EXISTS"
            " (SELECT 1 FROM samples WHERE series_id = series.id) AND NOT EXISTS"
            " (SELECT 1 FROM minutes WHERE series_id = series.id)"
        ).rowcount
        conn.execute("COMMIT")
        if done > self._rolled_until:
            self._rolled_until = done
        if gone:
            self._ids = {name: sid for sid, name in conn.execute("SELECT id, name FROM series")}

    # -----------------------------------------------------------------------------------------
    # History

    def history(
        self,
        start: float,
        end: float,
        series: Optional[List[str]] = None,
        prefix: Optional[List[str]] = None,
    ) -> Dict[str, Any]:
        """Samples between ``start`` and ``end`` (inclusive), unflushed ones included.

        ``series`` names exact series, ``prefix`` selects every series whose name starts with
        one of its strings; with neither, every series. Only series with data in the range are
        in the answer. Raw (``{"t", "v"}``) when the range is at most 6 hours and the raw tier
        still covers ``start``; otherwise one-minute ``{"t", "min", "mean", "max"}`` with ``t``
        the start of each minute. Times ascend. On a database error, what could be read.
        """
        try:
            start, end = float(start), float(end)
        except (TypeError, ValueError):
            return {"resolution": "raw", "start": start, "end": end, "series": {}}
        now = self._clock()
        raw = end - start <= RAW_QUERY_MAX_SECONDS and start >= now - self.raw_seconds
        result: Dict[str, Any] = {
            "resolution": "raw" if raw else "minute", "start": start, "end": end, "series": {},
        }
        if not (math.isfinite(start) and math.isfinite(end)) or end < start:
            return result
        with self._lock:
            with self._buf_lock:
                buffered = [r for r in self._buf if start <= r[1] <= end]
            names = set(self._ids) | {r[0] for r in buffered}
            chosen = sorted(n for n in names if _selected(n, series, prefix))
            if raw:
                result["series"] = self._raw_history(chosen, start, end, buffered)
            else:
                result["series"] = self._minute_history(chosen, start, end, buffered)
        return result

    def _raw_history(
        self, names: List[str], start: float, end: float, buffered: List[Row]
    ) -> Dict[str, Any]:
        out: Dict[str, Dict[str, List[float]]] = {}
        try:
            conn = self._db()
            for name in names:
                sid = self._ids.get(name)
                if sid is None:
                    continue
                rows = conn.execute(
                    "SELECT t, v FROM samples WHERE series_id = ? AND t >= ? AND t <= ?"
                    " ORDER BY t",
                    (sid, start, end),
                ).fetchall()
                if rows:
                    out[name] = {"t": [r[0] for r in rows], "v": [r[1] for r in rows]}
        except sqlite3.Error as e:
            self._read_failed("history", e)
        extra: Dict[str, List[Tuple[float, float]]] = {}
        wanted = set(names)
        for name, t, v in buffered:
            if name in wanted:
                extra.setdefault(name, []).append((t, v))
        for name, points in extra.items():
            entry = out.setdefault(name, {"t": [], "v": []})
            merged = sorted(zip(entry["t"] + [p[0] for p in points],
                                entry["v"] + [p[1] for p in points]))
            entry["t"] = [p[0] for p in merged]
            entry["v"] = [p[1] for p in merged]
        return out

    def _minute_history(
        self, names: List[str], start: float, end: float, buffered: List[Row]
    ) -> Dict[str, Any]:
        m_start, m_end = math.floor(start / 60.0), math.floor(end / 60.0)
        rolled = self._rolled_until
        done: Dict[str, List[Tuple[float, float, float, float]]] = {}  # rolled-up minutes
        live: Dict[str, Dict[int, List[float]]] = {}  # newer: minute -> [min, sum, max, n]
        try:
            conn = self._db()
            for name in names:
                sid = self._ids.get(name)
                if sid is None:
                    continue
                if m_start < rolled:
                    done[name] = conn.execute(
                        "SELECT m * 60.0, vmin, vmean, vmax FROM minutes"
                        " WHERE series_id = ? AND m >= ? AND m <= ? AND m < ? ORDER BY m",
                        (sid, m_start, m_end, rolled),
                    ).fetchall()
                if m_end >= rolled:
                    # Minutes not rolled up yet come straight from the raw tier.
                    live[name] = {
                        m: [lo, total, hi, n]
                        for m, lo, total, hi, n in conn.execute(
                            "SELECT CAST(t / 60 AS INTEGER), MIN(v), SUM(v), MAX(v), COUNT(*)"
                            " FROM samples WHERE series_id = ? AND t >= ? AND t < ?"
                            " GROUP BY CAST(t / 60 AS INTEGER)",
                            (sid, max(m_start, rolled) * 60.0, (m_end + 1) * 60.0),
                        )
                    }
        except sqlite3.Error as e:
            self._read_failed("history", e)
        wanted = set(names)
        for name, t, v in buffered:
            m = math.floor(t / 60.0)
            if name not in wanted or m < rolled:
                continue
            minutes = live.setdefault(name, {})
            cell = minutes.get(m)
            if cell is None:
                minutes[m] = [v, v, v, 1]
            else:
                cell[0] = min(cell[0], v)
                cell[1] += v
                cell[2] = max(cell[2], v)
                cell[3] += 1
        out: Dict[str, Dict[str, List[float]]] = {}
        for name in names:
            minutes = live.get(name, {})
            rows = done.get(name, []) + [
                (m * 60.0, c[0], c[1] / c[3], c[2])
                for m, c in sorted(minutes.items())
            ]
            if rows:
                times, lows, means, highs = (list(col) for col in zip(*rows))
                out[name] = {"t": times, "min": lows, "mean": means, "max": highs}
        return out

    # -----------------------------------------------------------------------------------------
    # Events

    def add_event(
        self,
        kind: str,
        message: str,
        *,
        level: str = "info",
        job_id: Optional[str] = None,
        data: Optional[Dict[str, Any]] = None,
        t: Optional[float] = None,
    ) -> Dict[str, Any]:
        """Record an event now (not batched) and return it as stored.

        Returns ``{"id", "time", "kind", "level", "message", "job_id", "data"}``. When the
        write fails, ``id`` is None and the event is written by a later ``flush()``.
        """
        when = _number(t)
        event: Dict[str, Any] = {
            "id": None,
            "time": self._clock() if when is None else when,
            "kind": str(kind),
            "level": str(level),
            "message": str(message),
            "job_id": None if job_id is None else str(job_id),
            "data": data,
        }
        with self._lock:
            try:
                conn = self._db()
                conn.execute("BEGIN IMMEDIATE")
                event_id = self._insert_event(conn, event)
                conn.execute("COMMIT")
                event["id"] = event_id
            except (sqlite3.Error, OSError) as e:
                self._rollback()
                if self._conn is not None:
                    self._pending_events.append(event)
                    del self._pending_events[:-_MAX_PENDING_EVENTS]
                self._write_failed("an event", e)
        return event

    @staticmethod
    def _insert_event(conn: sqlite3.Connection, event: Dict[str, Any]) -> int:
        data = None
        if event["data"] is not None:
            try:
                data = json.dumps(event["data"], default=str)
            except ValueError:  # a structure that refers to itself
                data = json.dumps(repr(event["data"]))
        cur = conn.execute(
            "INSERT INTO events (time, kind, level, message, job_id, data)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (event["time"], event["kind"], event["level"], event["message"], event["job_id"],
             data),
        )
        return int(cur.lastrowid or 0)

    def events(
        self,
        since: Optional[float] = None,
        until: Optional[float] = None,
        job_id: Optional[str] = None,
        after_id: Optional[int] = None,
        limit: int = 500,
    ) -> List[Dict[str, Any]]:
        """Stored events, oldest first.

        With ``since`` or ``after_id`` the first ``limit`` events from there (to page forward);
        with neither the latest ``limit``. ``[]`` on a database error.
        """
        where: List[str] = []
        args: List[Any] = []
        for clause, value in (("time >= ?", since), ("time <= ?", until),
                              ("job_id = ?", job_id), ("id > ?", after_id)):
            if value is not None:
                where.append(clause)
                args.append(value)
        sql = "SELECT id, time, kind, level, message, job_id, data FROM events"
        if where:
            sql += " WHERE " + " AND ".join(where)
        forward = since is not None or after_id is not None
        sql += " ORDER BY id " + ("ASC" if forward else "DESC") + " LIMIT ?"
        args.append(_limit(limit, 500))
        with self._lock:
            try:
                rows = self._db().execute(sql, args).fetchall()
            except (sqlite3.Error, OverflowError) as e:
                self._read_failed("events", e)
                return []
        if not forward:
            rows.reverse()
        return [
            {"id": r[0], "time": r[1], "kind": r[2], "level": r[3], "message": r[4],
             "job_id": r[5], "data": _loads(r[6])}
            for r in rows
        ]

    # -----------------------------------------------------------------------------------------
    # Jobs

    def save_job(self, job: Dict[str, Any]) -> None:
        """Insert or replace the job with ``job["id"]``. The whole dict is kept as JSON.

        A job counts as finished (and is dropped after ``keep_days``) once it has an ``ended``
        time, unless its state is one it can be resumed from (parked). Logs and returns on a
        write error or a job without an id.
        """
        if not isinstance(job, dict) or job.get("id") in (None, ""):
            log.error("not saving a job without an id: %.200r", job)
            return
        try:
            data = json.dumps(job, default=str)
        except (TypeError, ValueError) as e:
            log.error("cannot save job %s: %s", job.get("id"), one_line(e, REASON_CHARS))
            return
        row = (
            str(job["id"]),
            None if job.get("name") is None else str(job.get("name")),
            None if job.get("state") is None else str(job.get("state")),
            _number(job.get("started")),
            _number(job.get("ended")),
            int(_is_finished(job)),
            data,
        )
        with self._lock:
            try:
                conn = self._db()
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(
                    "INSERT INTO jobs (id, name, state, started, ended, finished, data)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
                    " name = excluded.name, state = excluded.state, started = excluded.started,"
                    " ended = excluded.ended, finished = excluded.finished, data = excluded.data",
                    row,
                )
                conn.execute("COMMIT")
            except (sqlite3.Error, OSError) as e:
                self._rollback()
                self._write_failed(f"job {row[0]}", e)

    def rewrite_jobs(self, change: Callable[[Dict[str, Any]], Optional[Dict[str, Any]]]) -> int:
        """Save ``change(job)`` for every saved job it returns a dict for (None: keep it). What
        is replaced is zeroed in the file (secure_delete) and the WAL emptied afterwards, so the
        old text leaves no copy on disk. Returns how many changed; a database error is logged."""
        with self._lock:
            changed = [j for j in (change(job) for job in
                                   self.list_jobs(include_finished=True, limit=1_000_000))
                       if j is not None]
            if not changed or self._conn is None:
                return 0
            conn = self._conn
            try:
                before = conn.execute("PRAGMA secure_delete").fetchone()[0]
                conn.execute("PRAGMA secure_delete = ON")
            except sqlite3.Error:
                before = None
            try:
                for job in changed:
                    self.save_job(job)
            finally:
                try:
                    if before is not None:
                        conn.execute(f"PRAGMA secure_delete = {int(before)}")
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                except sqlite3.Error as e:
                    log.warning("history database: the WAL was not emptied: %s",
                                one_line(e, REASON_CHARS))
            return len(changed)

    def get_job(self, job_id: str) -> Optional[Dict[str, Any]]:
        """The saved job dict, or None when there is none (or on a database error)."""
        with self._lock:
            try:
                row = self._db().execute(
                    "SELECT data FROM jobs WHERE id = ?", (str(job_id),)
                ).fetchone()
            except sqlite3.Error as e:
                self._read_failed("jobs", e)
                return None
        job = _loads(row[0]) if row else None
        return job if isinstance(job, dict) else None

    def list_jobs(self, include_finished: bool = True, limit: int = 200) -> List[Dict[str, Any]]:
        """Saved jobs, newest start first (not yet started ones first of all); ``[]`` on error."""
        sql = "SELECT data FROM jobs"
        if not include_finished:
            sql += " WHERE finished = 0"
        sql += " ORDER BY started IS NOT NULL, started DESC, rowid DESC LIMIT ?"
        with self._lock:
            try:
                rows = self._db().execute(sql, (_limit(limit, 200),)).fetchall()
            except (sqlite3.Error, OverflowError) as e:
                self._read_failed("jobs", e)
                return []
        jobs = [_loads(r[0]) for r in rows]
        return [j for j in jobs if isinstance(j, dict)]

    # -----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush and close. Later calls read nothing and write nothing; never raises."""
        with self._lock:
            self.flush()
            if self._conn is not None:
                try:
                    self._conn.close()
                except sqlite3.Error as e:  # pragma: no cover - close rarely fails
                    log.error("closing %s: %s", self.path, one_line(e, REASON_CHARS))
                self._conn = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _selected(name: str, series: Optional[Iterable[str]], prefix: Optional[Iterable[str]]) -> bool:
    if series is None and prefix is None:
        return True
    if isinstance(series, str):
        series = [series]
    if isinstance(prefix, str):
        prefix = [prefix]
    return (series is not None and name in series) or (
        prefix is not None and any(name.startswith(p) for p in prefix)
    )


def _loads(text: Optional[str]) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _limit(value: Any, default: int) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError, OverflowError):
        return default
