"""The store's history: series in two tiers (raw samples, one-minute min/mean/max), read
back for a time range, with samples not written yet merged in.
"""

from __future__ import annotations

import math
import sqlite3
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

Row = Tuple[str, float, float]  # series name, time, value
Db = Callable[[], sqlite3.Connection]  # the connection (sqlite3.Error when there is none)
Failed = Callable[[str, BaseException], None]  # what failed, why


def selected(name: str, series: Optional[Iterable[str]], prefix: Optional[Iterable[str]]) -> bool:
    if series is None and prefix is None:
        return True
    if isinstance(series, str):
        series = [series]
    if isinstance(prefix, str):
        prefix = [prefix]
    return (series is not None and name in series) or (
        prefix is not None and any(name.startswith(p) for p in prefix)
    )


def roll_up(conn: sqlite3.Connection, m_from: int, m_to: int) -> None:
    """(Re)compute the minute tier for minutes ``m_from`` to ``m_to`` (not included)."""
    conn.execute(
        "INSERT OR REPLACE INTO minutes (series_id, m, vmin, vmean, vmax, n)"
        " SELECT series_id, CAST(t / 60 AS INTEGER), MIN(v), AVG(v), MAX(v), COUNT(*)"
        " FROM samples WHERE series_id IN (SELECT id FROM series) AND t >= ? AND t < ?"
        " GROUP BY series_id, CAST(t / 60 AS INTEGER)",
        (m_from * 60.0, m_to * 60.0),
    )


def raw_history(
    db: Db,
    ids: Mapping[str, int],
    names: List[str],
    start: float,
    end: float,
    buffered: List[Row],
    failed: Failed,
) -> Dict[str, Any]:
    """The raw samples of series ``names`` from ``start`` to ``end``, the buffered ones
    (``buffered``, not written yet) merged in; a read error goes to ``failed``."""
    out: Dict[str, Dict[str, List[float]]] = {}
    try:
        conn = db()
        for name in names:
            sid = ids.get(name)
            if sid is None:
                continue
            rows = conn.execute(
                "SELECT t, v FROM samples WHERE series_id = ? AND t >= ? AND t <= ? ORDER BY t",
                (sid, start, end),
            ).fetchall()
            if rows:
                out[name] = {"t": [r[0] for r in rows], "v": [r[1] for r in rows]}
    except sqlite3.Error as e:
        failed("history", e)
    extra: Dict[str, List[Tuple[float, float]]] = {}
    wanted = set(names)
    for name, t, v in buffered:
        if name in wanted:
            extra.setdefault(name, []).append((t, v))
    for name, points in extra.items():
        entry = out.setdefault(name, {"t": [], "v": []})
        merged = sorted(
            zip(entry["t"] + [p[0] for p in points], entry["v"] + [p[1] for p in points])
        )
        entry["t"] = [p[0] for p in merged]
        entry["v"] = [p[1] for p in merged]
    return out


def minute_history(
    db: Db,
    ids: Mapping[str, int],
    rolled: int,
    names: List[str],
    start: float,
    end: float,
    buffered: List[Row],
    failed: Failed,
) -> Dict[str, Any]:
    """One-minute min/mean/max of series ``names`` from ``start`` to ``end``: rolled-up minutes
    (those before ``rolled``) from the minute tier, newer ones from the raw tier and the buffer;
    a read error goes to ``failed``."""
    m_start, m_end = math.floor(start / 60.0), math.floor(end / 60.0)
    done: Dict[str, List[Tuple[float, float, float, float]]] = {}  # rolled-up minutes
    live: Dict[str, Dict[int, List[float]]] = {}  # newer: minute -> [min, sum, max, n]
    try:
        conn = db()
        for name in names:
            sid = ids.get(name)
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
        failed("history", e)
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
            (m * 60.0, c[0], c[1] / c[3], c[2]) for m, c in sorted(minutes.items())
        ]
        if rows:
            times, lows, means, highs = (list(col) for col in zip(*rows))
            out[name] = {"t": times, "min": lows, "mean": means, "max": highs}
    return out


def maintain(
    conn: sqlite3.Connection, rolled_until: int, now: float, raw_seconds: float, keep_seconds: float
) -> Tuple[int, bool]:
    """Roll up the minutes completed since ``rolled_until`` and drop what is past retention
    (raw samples after ``raw_seconds``; minutes, events and ended jobs after ``keep_seconds``),
    in one transaction. Returns (the minute rolled up to now, whether series were dropped)."""
    rolled = max(rolled_until, 0)
    done = math.floor(now / 60.0)  # minutes before this one are complete
    raw_cutoff = now - raw_seconds
    keep_cutoff = now - keep_seconds
    conn.execute("BEGIN IMMEDIATE")
    if done > rolled:
        if rolled == 0:
            first = conn.execute(
                "SELECT MIN(t) FROM samples WHERE series_id IN (SELECT id FROM series)"
            ).fetchone()[0]
            rolled = math.floor(first / 60.0) if first is not None else done
        roll_up(conn, rolled, done)
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
    return done, bool(gone)
