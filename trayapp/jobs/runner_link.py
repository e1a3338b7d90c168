"""The link to the runner inside each job: the job's channel, and what the runner's messages
(hello, progress, state, checkpointed, note, bye) and its disconnects do to the job.

Every message is parsed (``messages.parse``) before anything of it is kept: a job's script can
send anything on its channel. What does not pass is counted and said at a bounded rate.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from trayapp.channel import ChannelServer, Peer
from trayapp.errors import Refused
from trayapp.jobs import eta, forecasts, messages
from trayapp.jobs.curves import Curves
from trayapp.jobs.job import BY_GUARD, BY_USER, COOPERATIVE, Event, Job, now
from trayapp.jobs.ladder import Stage, grace
from trayapp.jobs.record import smallest_micro_batch
from trayapp.jobs.record_parts import Checkpoint, Forecast, Note
from trayapp.jobs.table import JobTable
from trayapp.jobs.transitions import On
from trayapp.runner import forecast as rf
from trayapp.runner import protocol as rp
from trayapp.text import one_line
from trayapp.vocab import EventKind as E
from trayapp.vocab import JobState as S

log = logging.getLogger("headroom.jobs")

MAX_NOTES = 50
# Warnings and errors a job sends become events (database rows kept for days, log lines): at
# most this many a minute per job; the rest are kept with the job only.
NOTE_EVENTS_PER_MINUTE = 20
# Kept as the runner sends them.
PROGRESS_FIELDS = (
    "epoch",
    "epochs",
    "step",
    "steps",
    "batch",
    "micro_batch",
    "accumulation",
    "shrinkable",
)
MAX_FIT_ANSWERS = 8  # --fit-batch answers a job gets (one a fit; a job that asks on and on
# and never reads would fill its channel until the engine's writes block)
MAX_FORECAST_EVENTS = 8  # a job's forecasts said as events (one a fit and micro-batch)
MAX_PEERS = 4  # connections a job's channel takes at once (the runner reconnects)
# Messages a job may send a second (on average; BURST at once). A runner sends a few: progress
# is throttled on its side. The excess is dropped before it is parsed, and counted, so that a
# job sending without end costs the engine little and never slows the guard's tick
# (benchmarks/bench_job_flood.py measures the rate the engine takes).
MESSAGES_PER_SECOND = 500.0
MESSAGES_BURST = 1000


class Rate:
    """A token bucket per job: ``take`` says whether one more message may be handled now and
    counts those that may not (``excess`` hands the count over once)."""

    def __init__(self, rate: float = MESSAGES_PER_SECOND, burst: int = MESSAGES_BURST):
        self.rate, self.burst = rate, burst
        self._lock = threading.Lock()
        self._buckets: Dict[str, List[float]] = {}  # job id -> [tokens, at, dropped]

    def take(self, job_id: str) -> bool:
        t = time.monotonic()
        with self._lock:
            b = self._buckets.setdefault(job_id, [float(self.burst), t, 0.0])
            b[0] = min(float(self.burst), b[0] + (t - b[1]) * self.rate)
            b[1] = t
            if b[0] >= 1.0:
                b[0] -= 1.0
                return True
            b[2] += 1
            return False

    def excess(self, job_id: str) -> int:
        with self._lock:
            b = self._buckets.get(job_id)
            if b is None or not b[2]:
                return 0
            n, b[2] = int(b[2]), 0.0
            return n

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._buckets.pop(job_id, None)


class RunnerLink:
    """The job manager's side of each job's channel, on the jobs of ``table``.

    ``kernel_idle(job, events)`` is told when a kernel's runner says no fit runs (under the
    lock; the manager points it at its kernels, ``KernelJobs.fit_ended``)."""

    def __init__(self, table: JobTable) -> None:
        self.table = table
        self.curves = Curves()  # each job's loss and metrics, for the jobs window
        self.rate = Rate()  # the messages each job may send a second
        self.kernel_idle: Callable[[Job, List[Event]], None] = lambda job, events: None

    def open_channel(self, job: Job) -> None:
        address = self.table.paths.job_address(job.id)
        job_id = job.id
        server = ChannelServer(
            address,
            job.key,
            lambda peer, data: self._on_message(job_id, peer, data),
            name=f"job-{job_id}",
            max_peers=MAX_PEERS,
            on_close=lambda peer: self._on_disconnect(job_id, peer),
        )
        try:
            server.start()
        except OSError as e:
            raise Refused(
                f"cannot open the job's channel at {address}: {e.strerror or e}"
            ) from None
        job.server = server

    def close_channel(self, job: Job) -> None:
        if job.server is not None:
            job.server.close()
            job.server = None
        self.rate.forget(job.id)
        job.peer = None
        job.change(connected=False)

    def _on_message(self, job_id: str, peer: Peer, data: bytes) -> None:
        if not self.rate.take(job_id):
            # Over the rate: dropped unread, counted, said with a later one; and this peer's
            # thread (it holds no lock) reads no faster than the rate meanwhile, so that a job
            # sending flat out fills its own socket instead of the engine's time.
            time.sleep(1.0 / MESSAGES_PER_SECOND)
            return None
        msg: Optional[messages.JobMessage]
        try:
            msg, dropped = messages.parse(data)
        except rp.ProtocolError as e:
            msg, dropped = None, [f"a message: {one_line(e, 200)}"]
        over = self.rate.excess(job_id)
        count = len(dropped) + over  # each message over the rate counts as one dropped
        if over:
            dropped.append(f"{over} messages over {MESSAGES_PER_SECOND:g} a second")
        events: List[Event] = []
        with self.table.lock:
            job = self.table.jobs.get(job_id)
            if job is None:
                return None
            if msg is not None:
                try:
                    self._dispatch(job, peer, msg, events)
                except Exception:  # a bad message must never cost the job its channel
                    if not self.table.drops.count(job_id):
                        log.exception("job %s: handling a message failed", job_id)
                    dropped.append(f"{type(msg).__name__.lower()}: handling it failed")
            if dropped:
                self._note_dropped(job, dropped, events, count)
        self.table.flush_events(events)
        return None

    def _note_dropped(
        self, job: Job, dropped: List[str], events: List[Event], count: Optional[int] = None
    ) -> None:
        """Count what was dropped from a job's messages (``count``, default one for each line
        of ``dropped``); say so the first time, then at most once a minute (the log and the
        job's events)."""
        due = self.table.drops.add(job.id, len(dropped) if count is None else count)
        job.change(dropped_fields=self.table.drops.count(job.id))
        job.dirty = True
        if due is None:
            return
        first, since = due
        text = messages.summary(dropped)
        if first:
            message = (
                f"job {job.id}: dropped what its messages held that Headroom does not take ({text})"
            )
        else:
            message = f"job {job.id}: {since} more dropped from its messages (last: {text})"
        events.append((E.JOB_BAD_MESSAGE, "warn", message, job.id, {"dropped": since}))

    def _dispatch(
        self, job: Job, peer: Peer, msg: messages.JobMessage, events: List[Event]
    ) -> None:
        if isinstance(msg, messages.Hello):
            self._on_hello(job, peer, msg, events)
        elif isinstance(msg, messages.Progress):
            self._on_progress(job, msg)
        elif isinstance(msg, messages.State):
            self._on_state(job, msg, events)
        elif isinstance(msg, messages.Checkpointed):
            if msg.path is not None:
                job.change(checkpoint=Checkpoint(msg.path, msg.epoch, msg.step, now()))
                self.table.save(job)
        elif isinstance(msg, messages.Note):
            self._on_note(job, msg, events)
        elif isinstance(msg, messages.Forecast):
            self._on_forecast(job, msg, events)
        elif isinstance(msg, messages.Bye):
            job.change(bye=msg)
            self.table.save(job)

    def _on_hello(self, job: Job, peer: Peer, msg: messages.Hello, events: List[Event]) -> None:
        if job.peer is not None and job.peer is not peer:
            job.peer.close()
        job.peer = peer
        peer.context["job"] = job.id
        job.change(
            hello=msg,
            connected=True,
            hooked=msg.fit_hook == messages.FIT_HOOK_INSTALLED or bool(msg.hooked),
        )
        if job.state == S.STARTING:
            self.table.move(job, On.RUNNER_UP)
        rec, runner_state = job.rec, msg.state
        if runner_state == messages.RUNNER_PAUSED and job.state in (S.RUNNING, S.PAUSING):
            self.table.set_paused(
                job, rec.paused_by or BY_USER, rec.pause_reason or "", COOPERATIVE, events
            )
        # A command given while the runner was away is given again now it is back.
        elif job.state == S.PAUSING:
            self.table.send(job, rp.PAUSE)
        elif job.state == S.PARKING:
            self.table.send(job, rp.PARK)
        elif job.state == S.STOPPING and job.stop_stage == Stage.ASK:
            self.table.send(job, rp.STOP)
        elif (
            job.state == S.PAUSED
            and rec.pause_mode == COOPERATIVE
            and runner_state == messages.RUNNER_RUNNING
        ):
            self.table.move(job, On.RESUMED)
        self.table.save(job)

    def _on_progress(self, job: Job, msg: messages.Progress) -> None:
        changes: Dict[str, Any] = {
            name: getattr(msg, name) for name in PROGRESS_FIELDS if name in msg.given
        }
        if "shrinkable" in changes:
            changes["shrinkable"] = msg.shrinkable is True
        if msg.logs:  # an epoch's first report has none yet: the last ones stay the job's
            changes["metrics"] = dict(msg.logs)
            self.curves.add(
                job.id,
                time.time(),
                epoch=msg.epoch,
                step=msg.step,
                steps=msg.steps,
                metrics=changes["metrics"],
                fit=msg.fit,
            )
        if "tf_memory" in msg.given:
            changes["tf_memory"] = None if msg.tf_memory is None else tuple(msg.tf_memory)
        job.change(**changes)
        if job.state == S.STARTING:
            self.table.move(job, On.RUNNER_UP)
        self._update_eta(job)
        job.dirty = True

    def _update_eta(self, job: Job) -> None:
        ref, seconds, changed = eta.estimate(job.rec, job.rate_ref, time.monotonic())
        job.rate_ref = ref
        if changed:
            job.change(eta_seconds=seconds)

    def _on_state(self, job: Job, msg: messages.State, events: List[Event]) -> None:
        state = msg.state
        if state is None:
            return  # dropped: not a state the runner has
        rec = job.rec
        if state == messages.RUNNER_PAUSED:
            # The runner pauses only when asked; after a resume a late "paused" is followed by
            # "running" as soon as the resume arrives, so only a pause under way counts.
            if job.state == S.PAUSING:
                self.table.set_paused(
                    job, rec.paused_by or BY_USER, rec.pause_reason or "", COOPERATIVE, events
                )
        elif state == messages.RUNNER_RUNNING:
            if job.state == S.PAUSED and rec.pause_mode == COOPERATIVE:
                # The runner resumed on its own (or on our word): it is running again.
                self.table.move(job, On.RESUMED)
                job.rate_ref = None
                self.table.save(job)
            elif job.state == S.STARTING:
                self.table.move(job, On.RUNNER_UP)
                self.table.save(job)
        elif state == messages.RUNNER_IDLE and job.rec.is_kernel:
            self.kernel_idle(job, events)  # an interrupted fit has ended (jobs.kernels)
        elif state == messages.RUNNER_STOPPING and job.state == S.STOPPING:
            # The runner ends its fit() at the next batch, after a checkpoint: no signal yet.
            due = grace(
                job.stop_stage,
                job.stop_next,
                time.monotonic(),
                granted=job.stop_grace,
                by_guard=job.stop_note[0] == BY_GUARD,
            )
            if due is not None:
                job.stop_grace = True
                job.stop_next = due
        job.change(runner_state=state)

    def _on_note(self, job: Job, msg: messages.Note, events: List[Event]) -> None:
        level, text = msg.level, msg.message  # one line, control characters escaped
        note = Note(text, level, now())
        job.change(notes=(job.rec.notes + (note,))[-MAX_NOTES:])
        job.dirty = True
        # Info notes ("no fit() seen") stay with the job; warnings and errors are events too.
        if level == messages.NOTE_INFO:
            return
        t = time.monotonic()
        start, count = job.note_window
        if t - start >= 60.0:
            start, count = t, 0
        count += 1
        job.note_window = (start, count)
        kind = E.JOB_SHRUNK if msg.topic == rp.TOPIC_SHRUNK else E.JOB_NOTE
        if count <= NOTE_EVENTS_PER_MINUTE:
            events.append((kind, str(level), f"job {job.id}: {text}", job.id, None))
        if count == NOTE_EVENTS_PER_MINUTE:
            events.append(
                (
                    E.JOB_NOTE,
                    "warn",
                    f"job {job.id} sends more than "
                    f"{NOTE_EVENTS_PER_MINUTE} warnings a minute; the rest of this "
                    "minute's are kept with the job only (headroom jobs --json)",
                    job.id,
                    None,
                )
            )

    def _on_forecast(self, job: Job, msg: messages.Forecast, events: List[Event]) -> None:
        """Say what the fit needs against what is free; answer a --fit-batch probe with the
        accumulation that fits (0: none does)."""
        # Bounded by the machine here, where its latest reading is kept (the parse knows no
        # machine): a figure none of its devices can hold is dropped and counted like a field
        # that fails its check, then the rest is judged.
        msg, dropped = forecasts.bounded(msg, job.rec, self.table.snapshot)
        if dropped:
            self._note_dropped(job, dropped, events)
        probe = msg.how == rf.PROBE
        rec = job.rec
        floor = smallest_micro_batch(rec)
        verdict = forecasts.judge(
            msg, rec.with_(shrinkable=rec.shrinkable or probe), self.table.snapshot, floor
        )
        if probe and job.fit_answers < MAX_FIT_ANSWERS:
            job.fit_answers += 1
            self.table.send(job, rp.FIT, accumulation=verdict.accumulation if verdict else 0)
        if verdict is None:
            return
        need = forecasts.ram_need(msg)  # what the guard waits for before resuming it
        job.change(
            forecast=Forecast(
                verdict.text, verdict.fits, verdict.accumulation, verdict.need, verdict.free, need
            )
        )
        job.dirty = True
        if job.forecasts_said >= MAX_FORECAST_EVENTS:
            return
        job.forecasts_said += 1
        level = "info" if verdict.fits else "warn"
        events.append(
            (
                E.JOB_FORECAST,
                level,
                f"job {job.id} ({rec.name}) {verdict.text}{forecasts.source_said(msg.how)}",
                job.id,
                {**verdict.to_json(), "batch": msg.batch, "how": msg.how},
            )
        )

    def _on_disconnect(self, job_id: str, peer: Peer) -> None:
        events: List[Event] = []
        with self.table.lock:
            job = self.table.jobs.get(job_id)
            if job is None:
                return
            if peer.cut_off and job.rec.answering:
                self.table.not_answering(job, peer)
                events.append(
                    (
                        E.JOB_NOTE,
                        "warn",
                        f"job {job.id} ({job.rec.name}) does not "
                        "read what Headroom sends it: not answering; the guard acts on "
                        "it by signals (suspend, stop) until it is launched again",
                        job.id,
                        {"answering": False},
                    )
                )
            elif job.peer is peer:
                job.peer = None
                job.change(connected=False)
                job.dirty = True
        self.table.flush_events(events)
