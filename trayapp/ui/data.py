"""Fetching what the dashboard shows from the engine's history: plain Python, no Qt.

The control channel caps one message at 1 MiB, so the history is asked for series by series and
in time chunks small enough to stay well below it. Runs off the GUI thread (``CallRunner``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from trayapp import series
from trayapp.engine.event_record import EngineEvent
from trayapp.engine.history_record import MINUTE, RAW, History
from trayapp.series import memory_only
from trayapp.vocab import EventKind as E
from trayapp.vocab import words

# The store answers one-minute rows for ranges over six hours; below, raw samples (1 per s).
RAW_LIMIT_SECONDS = 6 * 3600
# Seconds per request: about 10,000 raw rows or 5,000 minute rows of one series (~400 KB).
RAW_CHUNK_SECONDS = 10_000.0
MINUTE_CHUNK_SECONDS = 5_000 * 60.0
# A prefix (the jobs' VRAM on a GPU) may hold several series: smaller chunks.
PREFIX_SHARE = 4
EVENT_PAGE = 500
EVENT_PAGES_MAX = 20

BASE_SERIES = tuple(name for name, _field in series.MEMORY_SERIES)
GPU_SERIES = ("total", "used", "util", "temp", series.OTHER)  # gpu<i>.<these>
# Kinds the dashboard draws (markers and shaded spans); other events are not fetched for it.
MARKER_KINDS = words(
    E.JOB_STARTED,
    E.JOB_PAUSED,
    E.JOB_RESUMED,
    E.JOB_PARKED,
    E.JOB_FINISHED,
    E.JOB_FAILED,
    E.JOB_STOPPED,
)
SPAN_KINDS = words(E.GUARD_WARN, E.GUARD_PAUSE, E.GUARD_PARK, E.GUARD_OK)


def series_for(gpu_indices: Iterable[int]) -> Tuple[List[str], List[str]]:
    """(exact names, prefixes) of the series the dashboard draws."""
    names = list(BASE_SERIES)
    # The jobs' memory (job.<id>.rss, .vram) and RAM by process name (ram.proc.<name>).
    prefixes: List[str] = ["job.", series.RAM_PROC]
    for i in sorted(set(gpu_indices)):
        names += [series.gpu_series(i, s) for s in GPU_SERIES]
        prefixes.append(series.gpu_series(i, series.job_layer("")))  # gpu<i>.job.<id>
        prefixes.append(series.gpu_series(i, series.PROC))  # gpu<i>.proc.<name>
    return names, prefixes


def _chunks(start: float, end: float, size: float) -> List[Tuple[float, float]]:
    out = []
    t = start
    while t < end:
        out.append((t, min(end, t + size)))
        t += size
    return out or [(start, end)]


def fetch_history(client: Any, start: float, end: float, gpu_indices: Iterable[int]) -> History:
    """The dashboard's series between ``start`` and ``end``, at one resolution. Raises what
    the client raises (EngineUnavailable, EngineError); a series without data in the range is
    absent."""
    names, prefixes = series_for(gpu_indices)
    span = end - start
    raw = span <= RAW_LIMIT_SECONDS
    if not raw:  # the engine keeps the series by process name for the last hour only
        prefixes = [p for p in prefixes if not memory_only(p)]
    chunk = RAW_CHUNK_SECONDS if raw else MINUTE_CHUNK_SECONDS
    jobs: List[Tuple[Dict[str, List[str]], Tuple[float, float]]] = []
    for name in names:
        jobs += [({"series": [name]}, c) for c in _chunks(start, end, chunk)]
    for prefix in prefixes:
        jobs += [({"prefix": [prefix]}, c) for c in _chunks(start, end, chunk / PREFIX_SHARE)]
    out = History(None, start, end)
    for which, (a, b) in jobs:
        answer: History = client.history(a, b, **which)
        if out.resolution is None:
            out = History(answer.resolution, start, end)
        if answer.resolution != out.resolution:
            # A chunk crossed the raw tier's horizon: keep one resolution for the whole range.
            continue
        # Chunk edges are inclusive on both sides: a row the previous chunk had is not doubled.
        out = out.joined(answer)
    return History(out.resolution or (RAW if raw else MINUTE), start, end, out.series)


def fetch_events(client: Any, since: float) -> List[EngineEvent]:
    """The events since ``since`` that the dashboard draws, oldest first (at most
    ``EVENT_PAGE * EVENT_PAGES_MAX`` read)."""
    out: List[EngineEvent] = []
    after: Optional[int] = None
    for _ in range(EVENT_PAGES_MAX):
        page = (
            client.events(since=since, after_id=after, limit=EVENT_PAGE)
            if after is not None
            else client.events(since=since, limit=EVENT_PAGE)
        )
        if not page:
            break
        out += [e for e in page if e.kind in MARKER_KINDS | SPAN_KINDS]
        ids = [e.id for e in page if e.id is not None]
        if len(page) < EVENT_PAGE or not ids:
            break
        after = max(ids)
    return out


def job_names(client: Any) -> Dict[str, str]:
    """Job id -> name of every job the engine knows (ended ones too): the names of the
    events' jobs."""
    return {job.id: job.name or job.id for job in client.jobs(all=True)}


@dataclass(frozen=True)
class RangeData:
    """What the dashboard shows for its range (``load_range``): the history up to ``end``, the
    events it marks, and the names of the jobs they are about (id -> name)."""

    range_seconds: float
    end: float
    history: History = field(default_factory=History)
    events: Sequence[EngineEvent] = ()
    jobs: Mapping[str, str] = field(default_factory=dict)


def load_range(client: Any, seconds: float, gpu_indices: Iterable[int], now: float) -> RangeData:
    """History and events for the last ``seconds`` up to ``now``, and the names of the jobs."""
    start = now - seconds
    return RangeData(
        seconds,
        now,
        fetch_history(client, start, now, list(gpu_indices)),
        fetch_events(client, start),
        job_names(client),
    )
