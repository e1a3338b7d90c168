"""The job manager's table of jobs: what every part of it shares (the lock, the live and ended
jobs, the store, finding a job by reference, saving it, reading a saved one back, events).

``JobTable`` is the state the manager's parts hold (each is given it when it is made): the
runner link, the brakes, the launcher, the controller, the kernels and the manager itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Union

from trayapp import config as configmod
from trayapp import vocab
from trayapp.config import Paths
from trayapp.errors import Refused, Unknown
from trayapp.jobs import messages, transitions, trees
from trayapp.jobs.job import BY_USER, SUSPENDED, Emit, Event, Job, now, who
from trayapp.jobs.record import JobRecord
from trayapp.jobs.transitions import On
from trayapp.readings import GpuReading, Snapshot
from trayapp.runner import protocol as rp
from trayapp.text import one_line
from trayapp.vocab import EventKind as E
from trayapp.vocab import JobState as S

log = logging.getLogger("headroom.jobs")

RECENT_ENDED = 50  # ended jobs kept in memory (the store keeps them all)
PREFIX_MIN = 4  # an id prefix names a job from this many characters on

# A job found by reference: one of the manager's (live or parked) or the record of an ended one.
Found = Union[Job, JobRecord]


class JobTable:
    """The jobs and what the manager's parts share (each part holds it). ``emit(kind,
    message, *, level, job_id, data)`` records and pushes an event; ``gpus()`` returns the
    engine's latest GPU readings; ``config()`` its current settings."""

    def __init__(
        self,
        paths: Paths,
        store: Any,
        *,
        emit: Emit,
        gpus: Callable[[], Iterable[GpuReading]] = lambda: (),
        config: Callable[[], Any] = lambda: configmod.Config(),
        runner_dir: Optional[Path] = None,
        wake: Callable[[], None] = lambda: None,
    ):
        self.paths = paths
        self.store = store
        self.emit = emit
        self.gpus = gpus
        self.config = config
        self.runner_dir = runner_dir  # None: the plan's default (also right in a frozen build)
        self.wake = wake  # the engine's next tick now (a job's process has ended)
        self.lock = threading.RLock()
        self.jobs: OrderedDict[str, Job] = OrderedDict()
        self.ended: OrderedDict[str, JobRecord] = OrderedDict()
        self.closed = False
        self.orphans = trees.Orphans()
        self.memory_total: Optional[int] = None  # from the engine's latest reading
        self.snapshot: Optional[Snapshot] = None  # the engine's latest reading (forecasts)
        self.drops = messages.DropLog()  # what jobs sent that was not taken, per job

    # -- finding ------------------------------------------------------------------------------

    def find(self, job_ref: str) -> Found:
        """The Job (live or parked) or the record of an ended one, by id, a unique id prefix or
        a unique name; LookupError else."""
        ref = str(job_ref).strip()
        if not ref:
            raise Unknown("no job named ''")
        if ref in self.jobs:
            return self.jobs[ref]
        if ref in self.ended:
            return self.ended[ref]
        saved = self.store.get_job(ref)
        if saved is not None:
            return saved
        found = _match(ref, {j.id: j.rec.name for j in self.jobs.values()})
        if found is not None:
            return self.jobs[found]
        older: Dict[str, JobRecord] = {r.id: r for r in self.stored_list(True, 500)}
        older.update(self.ended)
        found = _match(ref, {i: r.name for i, r in older.items()})
        if found is not None:
            return older[found]
        raise Unknown(f"no job named {ref}")

    def live(self, job_ref: str, what: str) -> Job:
        job = self.find(job_ref)
        if not isinstance(job, Job) or job.state not in vocab.LIVE:
            rec = job if isinstance(job, JobRecord) else job.rec
            done = what + ("d" if what.endswith("e") else "ed")  # paused, parked
            raise Refused(f"job {rec.id} is {rec.state}; it cannot be {done}")
        return job

    # -- the store ----------------------------------------------------------------------------

    def stored_list(
        self, include_finished: bool, limit: int, keep: Optional[Callable[[Any], bool]] = None
    ) -> List[JobRecord]:
        """The saved records (``Store.list_jobs``); with ``keep``, only the rows it keeps are
        read into records (a record is read with the checks of the job's messages: not for
        every row, every push)."""
        return self.store.list_jobs(include_finished=include_finished, limit=limit, keep=keep)

    def save(self, job: Job) -> None:
        job.dirty = False
        job.last_saved = time.monotonic()
        self.store.save_job(job.rec)

    def retire(self, job: Job) -> None:
        """An ended job leaves the live set; the last ones are kept at hand."""
        self.jobs.pop(job.id, None)
        self.ended[job.id] = job.rec
        while len(self.ended) > RECENT_ENDED:
            self.ended.popitem(last=False)

    # -- shared by the parts ------------------------------------------------------------------

    @staticmethod
    def move(
        job: Job, event: On, *, by: Optional[str] = None, reason: str = "", **given: Any
    ) -> None:
        """Move the job as the table of transitions says for ``event`` (``transitions.step``).
        A change the table does not have is logged, and made all the same: the job is where
        its process says it is."""
        try:
            change = transitions.step(job.rec, event, by=by, reason=reason, **given)
            job.rec = job.rec.moved(change.state, **change.changes)
        except transitions.NotAllowed as e:
            log.warning("%s; moved to %s all the same", e, e.target)
            change = transitions.step(job.rec, event, by=by, reason=reason, force=True, **given)
            job.rec = job.rec.with_(state=change.state, **change.changes)

    def setting(self, name: str, default: Any) -> Any:
        try:
            return self.config()[name]
        except (KeyError, TypeError):
            return default

    def flush_events(self, events: List[Event]) -> None:
        for kind, level, message, job_id, data in events:
            self.emit(kind, message, level=level, job_id=job_id, data=data)

    def send(self, job: Job, kind: str, **fields: Any) -> bool:
        """Give the runner a command without waiting on it: it goes into the job's outbox,
        which its own thread writes (the caller may hold the lock that the tick needs). One
        command of a kind waits at a time (the latest). False when there is no runner to
        tell: none connected, or one that does not answer (its channel was cut)."""
        peer = job.peer
        if peer is None or peer.closed or not job.rec.answering:
            return False
        # A peer that does not read is cut by its channel; on_close marks it not answering.
        return peer.post(rp.make(kind, **fields), key=kind)

    def not_answering(self, job: Job, peer: Any) -> None:
        """The runner does not read what it is sent: its channel is cut, and the job is
        handled by signals from now on (``answering`` False) until it is launched again."""
        if job.peer is peer:
            job.peer = None
        if not job.rec.answering:
            return
        job.change(answering=False, connected=False)
        self.save(job)
        log.warning(
            "job %s (%s) does not read what the engine sends; cut off: the guard "
            "acts on it by signals",
            job.id,
            one_line(job.rec.name, 80),
        )

    def pause_deadline(self, deadline: Optional[float]) -> float:
        if deadline is not None:
            return max(0.0, float(deadline))
        return float(self.setting("guard.pause_deadline_seconds", 2.0))

    def set_paused(
        self, job: Job, by: str, reason: str, mode: str, events: List[Event], note: str = ""
    ) -> None:
        already = job.state == S.PAUSED
        self.move(job, On.SUSPENDED if mode == SUSPENDED else On.PAUSED, by=by, reason=reason)
        if job.rec.paused_at is None:
            job.change(paused_at=now())
        job.pause_deadline = None
        self.save(job)
        if not already or mode == SUSPENDED:
            how = "suspended" if mode == SUSPENDED else "paused at a batch end"
            why = f": {reason}" if reason else ""
            events.append(
                (
                    E.JOB_PAUSED,
                    "info" if by == BY_USER else "warn",
                    f"job {job.id} ({job.rec.name}) {how} by {who(by)}{why}{note}",
                    job.id,
                    {"by": by, "reason": reason, "pause_mode": mode},
                )
            )


def _match(ref: str, names: Dict[str, str]) -> Optional[str]:
    """The one id that ``ref`` is a prefix of (``PREFIX_MIN`` characters at least), else the one
    job named ``ref``; None when none is. LookupError when more than one match."""
    for matcher in (
        lambda i, n: i.startswith(ref) and len(ref) >= PREFIX_MIN,
        lambda i, n: n == ref,
    ):
        hits = [i for i, n in names.items() if matcher(i, n)]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise Unknown(f"{ref} matches {len(hits)} jobs ({', '.join(hits[:5])}); use the id")
    return None
