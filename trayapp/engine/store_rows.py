"""The store's events and jobs as rows: what a row holds, and the SQL that writes and reads
them (the store's lock, transactions and error handling are the store's)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any, List, Optional, Sequence, Tuple

from trayapp.engine.event_record import EngineEvent
from trayapp.engine.store_schema import is_finished, limit, loads, number
from trayapp.jsonvalue import JSONObject

EVENT_COLUMNS = "id, time, kind, level, message, job_id, data"
EVENTS_LIMIT = 500

UPSERT_JOB = (
    "INSERT INTO jobs (id, name, state, started, ended, finished, data)"
    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
    " name = excluded.name, state = excluded.state, started = excluded.started,"
    " ended = excluded.ended, finished = excluded.finished, data = excluded.data"
)
JobRow = Tuple[str, Optional[str], Optional[str], Optional[float], Optional[float], int, str]


def insert_event(conn: sqlite3.Connection, event: EngineEvent) -> int:
    """Insert ``event`` (its data as JSON); its new id."""
    data = None
    if event.data is not None:
        try:
            data = json.dumps(event.data, default=str)
        except ValueError:  # a structure that refers to itself
            data = json.dumps(repr(event.data))
    cur = conn.execute(
        "INSERT INTO events (time, kind, level, message, job_id, data) VALUES (?, ?, ?, ?, ?, ?)",
        (event.time, event.kind, event.level, event.message, event.job_id, data),
    )
    return int(cur.lastrowid or 0)


def events_query(
    since: Optional[float],
    until: Optional[float],
    job_id: Optional[str],
    after_id: Optional[int],
    count: Any,
) -> Tuple[str, List[Any], bool]:
    """(SQL, its arguments, whether it reads forward): with ``since`` or ``after_id`` the
    first ``count`` events from there, with neither the latest ``count`` (newest first)."""
    where: List[str] = []
    args: List[Any] = []
    for clause, value in (
        ("time >= ?", since),
        ("time <= ?", until),
        ("job_id = ?", job_id),
        ("id > ?", after_id),
    ):
        if value is not None:
            where.append(clause)
            args.append(value)
    sql = f"SELECT {EVENT_COLUMNS} FROM events"
    if where:
        sql += " WHERE " + " AND ".join(where)
    forward = since is not None or after_id is not None
    sql += " ORDER BY id " + ("ASC" if forward else "DESC") + " LIMIT ?"
    args.append(limit(count, EVENTS_LIMIT))
    return sql, args, forward


def event_of(row: Sequence[Any]) -> EngineEvent:
    data = loads(row[6])
    return EngineEvent(
        id=row[0],
        time=row[1],
        kind=row[2],
        level=row[3],
        message=row[4],
        job_id=row[5],
        data=data if isinstance(data, dict) else None if data is None else {"value": data},
    )


def job_row(job: JSONObject) -> JobRow:
    """The row of a job: the columns retention and listing read, and the whole dict as JSON.
    Raises TypeError or ValueError for a dict that is not JSON."""
    return (
        str(job["id"]),
        None if job.get("name") is None else str(job.get("name")),
        None if job.get("state") is None else str(job.get("state")),
        number(job.get("started")),
        number(job.get("ended")),
        int(is_finished(job)),
        json.dumps(job, default=str),
    )


def jobs_query(include_finished: bool) -> str:
    """Saved jobs, newest start first (not yet started ones first of all)."""
    sql = "SELECT data FROM jobs"
    if not include_finished:
        sql += " WHERE finished = 0"
    return sql + " ORDER BY started IS NOT NULL, started DESC, rowid DESC LIMIT ?"


def job_of(text: Optional[str]) -> Optional[JSONObject]:
    """A saved job's dict; None for a row that does not hold one."""
    job = loads(text)
    return job if isinstance(job, dict) else None
