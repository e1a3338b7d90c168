"""What can be done to a job: pause, resume, park, stop and kill (the stop ladder's steps taken
as ``trayapp.jobs.ladder`` says), for one job or all; and the control channel's ``job_action``,
a table of those operations, each with how long its answer waits for the job to get there.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, List, Mapping, Optional

from trayapp import vocab
from trayapp.channel import Peer
from trayapp.errors import Refused
from trayapp.jobs import ladder, trees
from trayapp.jobs.braking import Brakes
from trayapp.jobs.job import (
    BY_USER,
    SUSPENDED,
    Event,
    Job,
    now,
    who,
)
from trayapp.jobs.kernels import KernelJobs, stops_itself
from trayapp.jobs.ladder import Stage, Step
from trayapp.jobs.record import JobRecord, smaller_accumulation
from trayapp.jobs.starting import Launcher
from trayapp.jobs.table import JobTable
from trayapp.jobs.transitions import On
from trayapp.jsonvalue import JSONObject
from trayapp.request_args import Args
from trayapp.runner import protocol as rp
from trayapp.vocab import EventKind as E
from trayapp.vocab import JobState as S

log = logging.getLogger("headroom.jobs")

# How long the control channel's answer to an action waits for the job to get there, at most.
PAUSE_SETTLE_EXTRA_SECONDS = 1.0  # beyond the pause deadline (then the tree is suspended)
RESUME_SETTLE_SECONDS = 0.0  # a resume answers at once
PARK_SETTLE_SECONDS = 45.0  # the runner reaches a batch end and writes its checkpoint
SETTLE_POLL_SECONDS = 0.05


class Controller:
    """Pause, resume, park and stop the jobs of ``table``: a parked or stopped job is launched
    again by ``launcher``; a resume by hand raises a job's cgroup limit (``brakes``); a kernel
    follows its own ladder where it has one (``kernels``)."""

    def __init__(
        self, table: JobTable, launcher: Launcher, brakes: Brakes, kernels: KernelJobs
    ) -> None:
        self.table = table
        self.launcher = launcher
        self.brakes = brakes
        self.kernels = kernels

    # -- pause and resume ---------------------------------------------------------------------

    def pause(
        self, job_ref: str, *, by: str = BY_USER, reason: str = "", deadline: Optional[float] = None
    ) -> JobRecord:
        """Pause a job: a cooperative pause at the next batch end when its runner hooked
        ``fit``, a suspend of the whole tree when ``deadline`` seconds pass first (default: the
        setting ``guard.pause_deadline_seconds``) or at once without the hook.

        Returns the job's record ("pausing" or "paused"). Raises LookupError for an unknown job,
        ValueError for one that cannot be paused now."""
        deadline = self.kernels.pause_deadline(job_ref, deadline)
        events: List[Event] = []
        with self.table.lock:
            job = self.table.live(job_ref, "pause")
            if job.state == S.PAUSING and deadline is not None:
                # A nearer deadline (the guard sees exhaustion coming) moves the suspend up.
                due = time.monotonic() + max(0.0, float(deadline))
                if job.pause_deadline is None or due < job.pause_deadline:
                    job.pause_deadline = due
                if deadline <= 0:
                    self.suspend(job, events, why=None)
            if job.state in vocab.PAUSED or job.state == S.PAUSING:
                result = job.rec
                self.table.flush_events(events)
                return result
            if job.state not in vocab.RUNNING:
                raise Refused(f"job {job.id} is {job.state}; it cannot be paused now")
            job.change(paused_by=by, pause_reason=reason or None, paused_at=now())
            wait = self.table.pause_deadline(deadline)
            if job.rec.hooked and wait > 0 and self.table.send(job, rp.PAUSE):
                self.table.move(job, On.PAUSE_ASKED, by=by, reason=reason)
                job.pause_deadline = time.monotonic() + wait
                self.table.save(job)
            else:
                self.suspend(job, events, why=None)
            result = job.rec
        self.table.flush_events(events)
        return result

    def suspend(self, job: Job, events: List[Event], why: Optional[str]) -> None:
        """Suspend every process of the tree (SIGSTOP); state "paused", mode "suspended"."""
        trees.suspend(job)
        job.pause_deadline = None
        note = f" ({why})" if why else ""
        self.table.set_paused(
            job,
            job.rec.paused_by or BY_USER,
            job.rec.pause_reason or "",
            SUSPENDED,
            events,
            note=note,
        )

    def resume(self, job_ref: str, *, by: str = BY_USER, reason: str = "") -> JobRecord:
        """Resume a paused job (the tree continues and/or the runner is told to), or relaunch
        a parked one from its checkpoint under the same id. Returns the job's record.

        Raises LookupError for an unknown job, ValueError for one that is not paused or parked
        or cannot be relaunched."""
        self.kernels.check_resume(job_ref)
        events: List[Event] = []
        with self.table.lock:
            job = self.table.find(job_ref)
            if isinstance(job, JobRecord):
                if job.state == S.STOPPED:
                    return self._resume_stopped(job, by, reason)
                raise Refused(
                    f"job {job.id} is {job.state}; only a paused, parked or "
                    "stopped job can be resumed"
                )
            if job.state in vocab.PARKED:
                self.launcher.relaunch(job, by, reason)
            elif job.state in vocab.PAUSED or job.state == S.PAUSING:
                self._continue(job, by, reason, events)
            elif job.state != S.RUNNING:
                raise Refused(
                    f"job {job.id} is {job.state}; only a paused, parked or "
                    "stopped job can be resumed"
                )
            result = job.rec
        self.table.flush_events(events)
        return result

    def _continue(self, job: Job, by: str, reason: str, events: List[Event]) -> None:
        """A paused (or pausing) job runs again."""
        # The word first: a runner that continues must find it before the next batch.
        self.table.send(job, rp.RESUME)
        if by == BY_USER:  # over its budget: its cgroup's limit rises as the guard's does
            self.brakes.brake_resumed(
                job, 1.0 - float(self.table.setting("guard.budget_warn_percent", 90.0)) / 100.0
            )
        trees.resume(job)
        self.table.move(job, On.RESUMED)
        job.pause_deadline = None
        job.rate_ref = None
        self.table.save(job)
        why = f": {reason}" if reason else ""
        events.append(
            (
                E.JOB_RESUMED,
                "info",
                f"job {job.id} ({job.rec.name}) resumed by {who(by)}{why}",
                job.id,
                {"by": by, "reason": reason},
            )
        )

    def _resume_stopped(self, saved: JobRecord, by: str, reason: str) -> JobRecord:
        """Relaunch a stopped job from its checkpoint under the same id, as a parked one."""
        job_id = saved.id
        if not saved.checkpoint_dir:
            raise Refused(
                f"job {job_id} was stopped and has no checkpoint folder: there is "
                "nothing to continue from (start it again with 'headroom run')"
            )
        folder = self.table.paths.jobs_dir / job_id
        if not folder.is_dir():
            raise Refused(f"job {job_id} cannot be relaunched: its folder {folder} is gone")
        try:
            key = (folder / "key").read_bytes()
        except OSError:
            key = b""
        job = Job(saved, key)  # a record from the store was checked as it was read back
        self.launcher.relaunch(job, by, reason)
        self.table.ended.pop(job_id, None)
        self.table.jobs[job_id] = job
        return job.rec

    # -- park ---------------------------------------------------------------------------------

    def park(
        self, job_ref: str, *, by: str = BY_USER, reason: str = "", smaller: bool = False
    ) -> JobRecord:
        """Ask the runner to checkpoint, end training and exit (state "parking", then "parked"
        when the process has ended with the park exit status). A suspended tree is resumed
        first so it can checkpoint. Returns the job's record. ``smaller``: a job that can shrink
        is relaunched as soon as it has parked, at half its micro-batch (``jobs.job.
        smaller_accumulation``), instead of waiting for memory to come back.

        Raises ValueError for a job without a checkpoint folder or without the runner's hook
        (parking would lose its progress), LookupError for an unknown job. A kernel is not
        parked: its fit is interrupted (``KernelJobs.interrupt``)."""
        if self.kernels.is_kernel(job_ref):
            return self.kernels.interrupt(job_ref, by=by, reason=reason)
        with self.table.lock:
            job = self.table.live(job_ref, "park")
            rec = job.rec
            if job.state == S.PARKING:
                return rec
            if job.state not in vocab.RUNNING | vocab.PAUSED | {S.PAUSING}:
                raise Refused(f"job {job.id} is {job.state}; it cannot be parked now")
            if not rec.checkpoint_dir:
                raise Refused(
                    f"job {job.id} has no checkpoint folder: parking would lose its "
                    "progress (pause or stop it instead)"
                )
            if not rec.hooked or job.peer is None:
                raise Refused(
                    f"job {job.id} does not report to Headroom (no Keras fit "
                    "hooked): parking would lose its progress (pause or stop it "
                    "instead)"
                )
            if rec.pause_mode == SUSPENDED:
                trees.resume(job)
            k = smaller_accumulation(rec) if smaller else None
            sent = (
                self.table.send(job, rp.PARK, accumulation=k)
                if k
                else self.table.send(job, rp.PARK)
            )
            if not sent:
                raise Refused(
                    f"job {job.id} did not take the request (its channel closed, "
                    "or it does not answer)"
                )
            job.park_note = (by, reason)
            job.smaller = k
            self.table.move(job, On.PARK_ASKED, by=by, reason=reason)
            job.pause_deadline = None
            self.table.save(job)
            return job.rec

    # -- stop ---------------------------------------------------------------------------------

    def stop(
        self, job_ref: str, *, by: str = BY_USER, reason: str = "", force: bool = False
    ) -> JobRecord:
        """Stop a job in steps (``trayapp.jobs.ladder``): the runner's own stop (when hooked),
        SIGINT to the group, SIGTERM to the tree, SIGKILL (Windows: CTRL_BREAK_EVENT, then
        terminate); ``force`` goes straight to SIGKILL. A suspended tree is continued first so
        it can handle the signals. Returns the job's record ("stopping"); ``tick`` finishes it.

        Raises LookupError for an unknown job, ValueError for one that has ended."""
        with self.table.lock:
            job = self.table.find(job_ref)
            if isinstance(job, Job) and job.state in vocab.PARKED:
                return self._stop_parked(job, by, reason)
            if isinstance(job, JobRecord) or job.state not in vocab.LIVE:
                raise Refused(f"job {job.id} is {job.state}; nothing to stop")
            self.begin_stop(job, by, reason, force)
            return job.rec

    def kill(self, job_ref: str, *, by: str = BY_USER, reason: str = "") -> JobRecord:
        """``stop`` straight to SIGKILL."""
        return self.stop(job_ref, by=by, reason=reason, force=True)

    def _stop_parked(self, job: Job, by: str, reason: str) -> JobRecord:
        """A parked job has no process: stopping it just closes it (the checkpoint stays)."""
        end_reason = f"stopped by {by} while parked" + (f": {reason}" if reason else "")
        self.table.move(job, On.CLOSED, reason=end_reason, ended=now())
        self.table.save(job)
        self.table.retire(job)
        self.table.emit(
            E.JOB_STOPPED,
            f"job {job.id} ({job.rec.name}) {end_reason}",
            job_id=job.id,
            data={"state": S.STOPPED.value, "exit_code": job.rec.exit_code},
        )
        return job.rec

    def begin_stop(self, job: Job, by: str, reason: str, force: bool, ask: bool = True) -> None:
        if job.state == S.STOPPING:
            if force and job.stop_stage < Stage.KILL:  # kill: SIGKILL now
                self.take_step(
                    job,
                    ladder.next_step(job.stop_stage, job.stop_next, time.monotonic(), force=True),
                )
            return
        job.stop_note = (by, reason)
        self.table.move(job, On.STOP_ASKED, by=by, reason=reason)
        job.pause_deadline = None
        self.table.save(job)
        if job.rec.pause_mode == SUSPENDED:
            # A stopped process cannot handle a signal; it must run again to end cleanly.
            trees.resume(job)
            job.change(pause_mode=None)
        self.take_step(
            job,
            ladder.first_step(time.monotonic(), hooked=stops_itself(job), ask=ask, force=force),
        )

    def advance_stop(self, job: Job, t: float, *, runner_gone: bool = False) -> None:
        """The next stop step, when one is due at monotonic time ``t``."""
        # Only SIGKILL's repeat asks what is left (a look at every process seen in the tree).
        remnants = job.stop_stage < Stage.KILL or (t >= job.stop_next and bool(trees.remnants(job)))
        self.take_step(
            job,
            ladder.next_step(
                job.stop_stage, job.stop_next, t, remnants=remnants, runner_gone=runner_gone
            ),
        )

    def take_step(self, job: Job, step: Optional[Step]) -> None:
        """Take a stop step now: ask the runner (the next step at once when it cannot be
        asked), or send the signal; then wait as the ladder says."""
        if step is None:
            return
        if step.stage == Stage.ASK:
            if not self.table.send(job, rp.STOP):
                step = ladder.step(Stage.INT, time.monotonic())
            else:
                job.stop_grace = False  # a new stop, asked of the runner
        trees.signal_stage(job, step.stage)
        job.stop_stage, job.stop_next = step.stage, step.due
        log.info("job %s: stop step %d", job.id, step.stage)

    def pause_all(self, *, by: str = BY_USER, reason: str = "") -> List[JobRecord]:
        """Pause every running job; returns their dicts."""
        with self.table.lock:
            ids = [j.id for j in self.table.jobs.values() if j.state in vocab.RUNNING]
        out = []
        for job_id in ids:
            try:
                out.append(self.pause(job_id, by=by, reason=reason))
            except (LookupError, ValueError):
                continue
        return out

    # -- the control channel's job_action -----------------------------------------------------

    def op_action(self, peer: Peer, args: Args) -> JSONObject:
        action = args.value("action")
        op = OPS.get(action) if isinstance(action, str) else None
        if op is None:
            raise Refused(f"unknown action {action!r} (one of {', '.join(ACTIONS)})")
        rec = op.run(self, args.text("job"), args.opt_text("reason") or "")
        return self._settle(rec, op.wait(self)).to_json()

    def _settle(self, rec: JobRecord, wait: float) -> JobRecord:
        """Wait (at most ``wait`` seconds) for an action to finish; the job's record then."""
        deadline = time.monotonic() + wait
        while rec.state in vocab.BUSY - {S.STARTING} and time.monotonic() < deadline:
            time.sleep(SETTLE_POLL_SECONDS)
            try:
                with self.table.lock:
                    found = self.table.find(rec.id)
            except LookupError:
                break
            rec = found.rec if isinstance(found, Job) else found
        return rec


@dataclass(frozen=True)
class Op:
    """One of the control channel's actions: ``run(manager, job, reason)`` and the seconds its
    answer waits, at most, for the job to leave the state the action put it in."""

    run: Callable[[Controller, str, str], JobRecord]
    wait: Callable[[Controller], float]


OPS: Mapping[str, Op] = {
    "pause": Op(
        lambda m, ref, why: m.pause(ref, by=BY_USER, reason=why),
        lambda m: m.table.pause_deadline(None) + PAUSE_SETTLE_EXTRA_SECONDS,
    ),
    "resume": Op(
        lambda m, ref, why: m.resume(ref, by=BY_USER, reason=why), lambda m: RESUME_SETTLE_SECONDS
    ),
    "park": Op(
        lambda m, ref, why: m.park(ref, by=BY_USER, reason=why), lambda m: PARK_SETTLE_SECONDS
    ),
    "stop": Op(
        lambda m, ref, why: m.stop(ref, by=BY_USER, reason=why), lambda m: ladder.settle_seconds()
    ),
    "kill": Op(
        lambda m, ref, why: m.kill(ref, by=BY_USER, reason=why), lambda m: ladder.KILL_WAIT_SECONDS
    ),
}
ACTIONS = tuple(OPS)
