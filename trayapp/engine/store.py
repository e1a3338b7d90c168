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

The parts: ``store_schema`` (the file: schema, migrations, opening, errors), ``store_history``
(the two tiers, reading them back, roll-up and retention), ``store_rows`` (events and jobs).
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set

from trayapp.engine import store_history as history
from trayapp.engine import store_rows
from trayapp.engine import store_schema as schema
from trayapp.engine.event_record import EngineEvent
from trayapp.engine.store_history import Row
from trayapp.engine.store_schema import MIGRATIONS, REASON_CHARS, SCHEMA_VERSION
from trayapp.jobs import saved
from trayapp.jobs.record import JobRecord
from trayapp.jsonvalue import JSONObject
from trayapp.text import one_line
from trayapp.vocab import EventKind as E

log = logging.getLogger("headroom.store")

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "Store"]

# Ranges up to this long are answered from raw samples (when the raw tier still covers them).
RAW_QUERY_MAX_SECONDS = 6 * 3600.0
# A sample closer than this to the last one kept for its series is dropped.
MIN_SAMPLE_SPACING_SECONDS = 1.0
MAINTENANCE_INTERVAL_SECONDS = 60.0
_MAX_PENDING_EVENTS = 1000


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
        self._pending_events: List[EngineEvent] = []
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
            self._conn = schema.connect(self.path)
        except schema.Unusable as e:
            self._start_over(str(e), e.tag)
        except (sqlite3.Error, OSError) as e:
            if schema.is_transient(e):
                self._use_memory(f"cannot open {self.path}: {one_line(e, REASON_CHARS)}")
            else:
                self._start_over(one_line(e, REASON_CHARS), "corrupt")
        else:
            self._load_state()

    def _start_over(self, reason: str, tag: str) -> None:
        """Move the unusable file aside, make a new one and record an event saying so."""
        moved = schema.move_aside(self.path, tag)
        if moved is None:
            self._use_memory(f"{self.path} is unusable ({reason}) and could not be moved aside")
            return
        log.warning("%s was unusable (%s); moved it aside to %s", self.path, reason, moved)
        self.recovered_from = moved
        try:
            self._conn = schema.connect(self.path)
        except (sqlite3.Error, OSError, schema.Unusable) as e:
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

    def _use_memory(self, reason: str) -> None:
        log.error("%s; history is kept in memory only until the engine restarts", reason)
        self._fallback_reason = f"{reason} (history kept in memory only)"
        self.write_error = self._fallback_reason
        try:
            self._conn = schema.connect(Path(":memory:"))
        except (sqlite3.Error, schema.Unusable) as e:  # pragma: no cover - needs a broken sqlite3
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
        self._log_once(
            f"read:{what}:{e}", "history database: %s failed: %s", what, one_line(e, REASON_CHARS)
        )
        if isinstance(e, sqlite3.DatabaseError) and schema.is_corrupt(e):
            self._recover_at_runtime(e)

    def _write_failed(self, what: str, e: BaseException) -> None:
        # Logged when writes start failing, not on every flush while they keep failing.
        if self.write_error is None or self.write_error == self._fallback_reason:
            log.error("cannot write %s to %s: %s", what, self.path, one_line(e, REASON_CHARS))
        self.write_error = f"cannot write {what} to {self.path}: {one_line(e, REASON_CHARS)}"
        if isinstance(e, sqlite3.DatabaseError) and schema.is_corrupt(e):
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
            math.floor(t / 60.0) for _, t, _ in rows if raw_cutoff <= t < self._rolled_until * 60.0
        }
        for m in late:
            history.roll_up(conn, m, m + 1)
        written: List[int] = []
        for event in self._pending_events:
            written.append(store_rows.insert_event(conn, event))
        conn.execute("COMMIT")
        self._ids.update(new_ids)
        for event, event_id in zip(self._pending_events, written):
            event.id = event_id
        self._pending_events = []

    def _maintain(self, now: float) -> None:
        conn = self._db()
        done, gone = history.maintain(
            conn, self._rolled_until, now, self.raw_seconds, self.keep_seconds
        )
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
            "resolution": "raw" if raw else "minute",
            "start": start,
            "end": end,
            "series": {},
        }
        if not (math.isfinite(start) and math.isfinite(end)) or end < start:
            return result
        with self._lock:
            with self._buf_lock:
                buffered = [r for r in self._buf if start <= r[1] <= end]
            names = set(self._ids) | {r[0] for r in buffered}
            chosen = sorted(n for n in names if history.selected(n, series, prefix))
            if raw:
                result["series"] = history.raw_history(
                    self._db, self._ids, chosen, start, end, buffered, self._read_failed
                )
            else:
                result["series"] = history.minute_history(
                    self._db,
                    self._ids,
                    self._rolled_until,
                    chosen,
                    start,
                    end,
                    buffered,
                    self._read_failed,
                )
        return result

    # -----------------------------------------------------------------------------------------
    # Events

    def add_event(
        self,
        kind: str,
        message: str,
        *,
        level: str = "info",
        job_id: Optional[str] = None,
        data: Optional[JSONObject] = None,
        t: Optional[float] = None,
    ) -> EngineEvent:
        """Record an event now (not batched) and return it as stored. When the write fails,
        its ``id`` is None and the event is written (and its id set) by a later ``flush()``.
        """
        when = schema.number(t)
        event = EngineEvent(
            time=self._clock() if when is None else when,
            kind=str(kind),
            level=str(level),
            message=one_line(str(message)),  # it may name a job: one printable line
            job_id=None if job_id is None else str(job_id),
            data=data,
        )
        with self._lock:
            try:
                conn = self._db()
                conn.execute("BEGIN IMMEDIATE")
                event_id = store_rows.insert_event(conn, event)
                conn.execute("COMMIT")
                event.id = event_id
            except (sqlite3.Error, OSError) as e:
                self._rollback()
                if self._conn is not None:
                    self._pending_events.append(event)
                    del self._pending_events[:-_MAX_PENDING_EVENTS]
                self._write_failed("an event", e)
        return event

    def events(
        self,
        since: Optional[float] = None,
        until: Optional[float] = None,
        job_id: Optional[str] = None,
        after_id: Optional[int] = None,
        limit: int = 500,
    ) -> List[EngineEvent]:
        """Stored events, oldest first.

        With ``since`` or ``after_id`` the first ``limit`` events from there (to page forward);
        with neither the latest ``limit``. ``[]`` on a database error.
        """
        sql, args, forward = store_rows.events_query(since, until, job_id, after_id, limit)
        with self._lock:
            try:
                found = self._db().execute(sql, args).fetchall()
            except (sqlite3.Error, OverflowError) as e:
                self._read_failed("events", e)
                return []
        if not forward:
            found.reverse()
        return [store_rows.event_of(r) for r in found]

    # -----------------------------------------------------------------------------------------
    # Jobs

    def save_job(self, rec: JobRecord) -> None:
        """Insert or replace the job's record (``save_row`` of its JSON)."""
        self.save_row(rec.to_json())

    def get_job(self, job_id: str) -> Optional[JobRecord]:
        """The saved job's record, read back with the checks (``jobs.saved.read``); None when
        there is none, it cannot be read, or on a database error."""
        return saved.read(self.row(job_id))

    def list_jobs(
        self,
        include_finished: bool = True,
        limit: int = 200,
        keep: Optional[Callable[[JSONObject], bool]] = None,
        adopting: bool = False,
    ) -> List[JobRecord]:
        """The saved jobs' records, newest start first (``rows``); with ``keep``, only the rows
        it keeps are read; a row that cannot be read is left out (logged)."""
        out = []
        for data in self.rows(include_finished, limit):
            if keep is not None and not keep(data):
                continue
            rec = saved.read(data, adopting=adopting)
            if rec is not None:
                out.append(rec)
        return out

    def save_row(self, job: JSONObject) -> None:
        """Insert or replace the job with ``job["id"]``. The whole dict is kept as JSON.

        A job counts as finished (and is dropped after ``keep_days``) once it has an ``ended``
        time, unless its state is one it can be resumed from (parked). Logs and returns on a
        write error or a job without an id.
        """
        if not isinstance(job, dict) or job.get("id") in (None, ""):
            log.error("not saving a job without an id: %.200r", job)
            return
        try:
            row = store_rows.job_row(job)
        except (TypeError, ValueError) as e:
            log.error("cannot save job %s: %s", job.get("id"), one_line(e, REASON_CHARS))
            return
        with self._lock:
            try:
                conn = self._db()
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(store_rows.UPSERT_JOB, row)
                conn.execute("COMMIT")
            except (sqlite3.Error, OSError) as e:
                self._rollback()
                self._write_failed(f"job {row[0]}", e)

    def rewrite_jobs(self, change: Callable[[JSONObject], Optional[JSONObject]]) -> int:
        """Save ``change(job)`` for every saved job it returns a dict for (None: keep it). What
        is replaced is zeroed in the file (secure_delete) and the WAL emptied afterwards, so the
        old text leaves no copy on disk. Returns how many changed; a database error is logged."""
        with self._lock:
            changed = [
                j
                for j in (change(job) for job in self.rows(include_finished=True, limit=1_000_000))
                if j is not None
            ]
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
                    self.save_row(job)
            finally:
                try:
                    if before is not None:
                        conn.execute(f"PRAGMA secure_delete = {int(before)}")
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                except sqlite3.Error as e:
                    log.warning(
                        "history database: the WAL was not emptied: %s", one_line(e, REASON_CHARS)
                    )
            return len(changed)

    def row(self, job_id: str) -> Optional[JSONObject]:
        """The saved job's JSON, or None when there is none (or on a database error)."""
        with self._lock:
            try:
                row = (
                    self._db()
                    .execute("SELECT data FROM jobs WHERE id = ?", (str(job_id),))
                    .fetchone()
                )
            except sqlite3.Error as e:
                self._read_failed("jobs", e)
                return None
        return store_rows.job_of(row[0]) if row else None

    def rows(self, include_finished: bool = True, limit: int = 200) -> List[JSONObject]:
        """Saved jobs' JSON, newest start first (not yet started ones first of all); ``[]`` on
        error. As written: ``list_jobs`` reads them into records."""
        with self._lock:
            try:
                found = (
                    self._db()
                    .execute(store_rows.jobs_query(include_finished), (schema.limit(limit, 200),))
                    .fetchall()
                )
            except (sqlite3.Error, OverflowError) as e:
                self._read_failed("jobs", e)
                return []
        return [j for j in (store_rows.job_of(r[0]) for r in found) if j is not None]

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
