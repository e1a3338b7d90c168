"""The guard inside the engine: readings in, ``guard.decide`` on them, actions carried out.

``GuardService.step`` runs in the engine's loop thread on every tick, whether or not a client
is connected; the control channel's threads only read ``state_json()``. Before any act (pause,
resume, park, stop) it takes a fresh reading and drops the act when its cause has passed.

It acts on the engine's jobs through the job manager, and on other processes only where a
``[[guard.rules]]`` entry names them, through ``foreign.ForeignProcesses`` (which reads the
process list, and continues those it suspended when memory is back and on ``close()``).

What it works with comes in through its constructor (the jobs, the job manager's acts, where
events go, a fresh reading, the policy, the process list), so it runs without an engine.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Dict, Optional, Protocol, Sequence, Tuple

import psutil

from trayapp.config import Config, ConfigError
from trayapp.engine import guard
from trayapp.engine.foreign import TOP_LIMIT, ForeignProcesses
from trayapp.engine.guard import (
    ENDED_STATES,
    RUNNING_STATES,
    Action,
    Decision,
    FillHistory,
    GuardInput,
    GuardState,
    JobView,
    Policy,
)
from trayapp.engine.parts import Parts
from trayapp.errors import Unknown
from trayapp.jobs.record import JobRecord
from trayapp.jsonvalue import JSONObject
from trayapp.probes.processes import (
    ProcessSampler,
    pids_rss,
    tree_vram,
)
from trayapp.readings import GpuReading, Snapshot
from trayapp.request_args import Handlers
from trayapp.vocab import EventKind as E
from trayapp.vocab import GuardAct as A
from trayapp.vocab import GuardCause as C
from trayapp.vocab import GuardLevel as L
from trayapp.vocab import GuardMode as M

log = logging.getLogger("headroom.guard")

FAILURE_QUIET_SECONDS = 60.0  # the same failed act is reported at most this often
BY = "guard"  # who the job manager is told paused, parked or stopped a job


# -- what the guard works with ----------------------------------------------------------------


class JobActs(Protocol):
    """What the guard asks of the job manager besides its jobs: a job's memory now, and the
    four acts (each raises LookupError or ValueError when it cannot be done). A pause
    ``at_once`` stops the job's process group before anything else, and continues it again
    when the pause is refused: the job's side signals its processes, never the guard."""

    def tree_bytes(self, job_id: str, pids: Sequence[int], /) -> Optional[int]: ...

    def pause(
        self,
        job_ref: str,
        /,
        *,
        by: str,
        reason: str,
        deadline: Optional[float],
        at_once: bool = ...,
    ) -> Any: ...

    def resume(self, job_ref: str, /, *, by: str, reason: str) -> Any: ...

    def park(self, job_ref: str, /, *, by: str, reason: str, smaller: bool = ...) -> Any: ...

    def stop(self, job_ref: str, /, *, by: str, reason: str) -> Any: ...


class Emit(Protocol):
    """Where the guard's events go (the engine's ``emit_event``)."""

    def __call__(
        self,
        kind: str,
        message: str,
        *,
        level: str = ...,
        job_id: Optional[str] = ...,
        data: Optional[JSONObject] = ...,
    ) -> Any: ...


class ConfigPolicy:
    """The policy of the settings ``config()`` gives, built again when they are replaced (a
    reload); settings it cannot use leave the previous policy in place."""

    def __init__(self, config: Callable[[], Config]):
        self._config = config
        self._seen: Any = None
        self._policy = Policy()

    def __call__(self) -> Policy:
        cfg = self._config()
        if cfg is not self._seen:
            try:
                self._policy = Policy.from_config(cfg)
            except (ConfigError, KeyError, ValueError, TypeError) as e:
                log.warning("guard settings unusable (%s); keeping the previous ones", e)
            self._seen = cfg
        return self._policy


class GuardService:
    """The engine-side guard.

    ``jobs()``: the job manager's jobs as records (``JobManager.guard_jobs``); ``acts``: the
    manager that pauses, resumes, parks and stops them (None: no job manager); ``emit``: where
    events go; ``read_snapshot(gpus_now)``: a fresh reading; ``policy()``: the guard's settings
    now; ``processes``: reads the process list when a warning should name names.
    """

    def __init__(
        self,
        *,
        jobs: Callable[[], Sequence[JobRecord]],
        acts: Optional[JobActs],
        emit: Emit,
        read_snapshot: Callable[[bool], Snapshot],
        policy: Callable[[], Policy],
        processes: Optional[ProcessSampler] = None,
    ):
        self._job_records = jobs
        self._acts = acts
        self._emit_event = emit
        self._read_snapshot = read_snapshot
        self.policy = policy
        self.foreign = ForeignProcesses(processes)  # the processes a rule names
        self.history = FillHistory()
        self.state = GuardState()
        self._lock = threading.RLock()
        self._last_input: Optional[GuardInput] = None
        self._last_decision: Optional[Decision] = None
        self._interval: Optional[float] = None
        self._gpus_seen: Any = None
        self._failures: Dict[str, float] = {}
        self._parts = Parts(log)  # what is not the ladder itself, each part on its own
        self._json: JSONObject = {
            "state": L.OK,
            "mode": self.policy().mode,
            "reasons": [],
            "seconds_to_exhaustion": None,
            "fill_rate_bytes_per_s": None,
        }

    # -- what the engine calls ----------------------------------------------------------------

    def handlers(self) -> Handlers:
        """Control-channel ops: ``guard`` answers the guard's part of the status."""
        return {"guard": lambda peer, args: self.state_json()}

    def wants_gpus(self) -> bool:
        """Whether the next tick should read the GPUs too (VRAM is near a threshold)."""
        return guard.wants_gpus(self._last_input, self.policy())

    def next_interval(self, base: float) -> float:
        """Seconds until the next tick (see ``guard.next_interval``)."""
        if not self._lock.acquire(blocking=False):
            return self._interval if self._interval is not None else base
        try:
            self._interval = guard.next_interval(
                self._last_input, self.history, self.policy(), base, self.state
            )
            return self._interval
        finally:
            self._lock.release()

    def state_json(self) -> JSONObject:
        """The guard's part of the status: state, mode, reasons, prediction, thresholds."""
        out = dict(self._json)
        # The mode as set now, not as of the last tick: a client that just changed it reads it
        # back at once.
        out["mode"] = self.policy().mode
        if self._interval is not None:
            out["interval_seconds"] = round(self._interval, 4)
        return out

    def step(self, snap: Snapshot) -> None:
        """One tick: decide on ``snap`` and carry out what was decided. Never raises."""
        with self._lock:
            try:
                self._step(snap)
            except Exception:  # the guard must keep watching after any one bad tick
                log.exception("guard: this tick failed; watching on")

    def close(self) -> None:
        """Continue the processes a rule suspended (the engine is going away)."""
        with self._lock:
            self.foreign.close()

    # -- one tick -----------------------------------------------------------------------------

    def _step(self, snap: Snapshot) -> None:
        policy = self.policy()
        jobs = self._jobs(snap.gpus)
        inp = self._input(snap, jobs)
        self.history.record(inp)
        d = guard.decide(inp, self.history, policy, self.state)
        if d.wants_processes and policy.mode != M.OFF and self.foreign.due():
            if self._parts.run("guard: the process list", self.foreign.sample, policy):
                inp = replace(inp, processes=self.foreign.views(jobs, policy))
                d = guard.decide(inp, self.history, policy, self.state)
        self.state = d.next
        self._last_input = inp
        for action in d.actions:
            try:
                self._carry_out(action, inp, policy)
            except Exception:
                log.exception("guard: %s failed", action.message)
        self._parts.run("guard: foreign processes", self.foreign.tend)
        self._last_decision = d
        self._parts.run("guard: the status", self._publish, d, policy, inp)

    def _jobs(self, gpus: Sequence[GpuReading] = ()) -> Tuple[JobView, ...]:
        """The jobs as the ladder sees them: the manager's own fields of each (never what a job
        sent), their RSS read again where a budget needs it. When the manager cannot answer,
        the jobs of the last tick, with their RSS read again."""
        records: Sequence[Any]
        try:
            records = self._job_records()
            self._parts.worked("guard: the job list")
        except Exception as e:
            self._parts.failed("guard: the job list", e)
            records = self._last_input.jobs if self._last_input is not None else ()
        views = []
        for record in records:
            try:
                views.append(self._job_view(record, gpus))
            except Exception as e:
                self._parts.failed("guard: a job's record", e)
        return tuple(views)

    def _job_view(self, record: Any, gpus: Sequence[GpuReading]) -> JobView:
        view = record if isinstance(record, JobView) else JobView.of(record)
        # VRAM from this tick's GPU readings (read every tick near a VRAM threshold).
        if view.vram_budget_bytes and view.pids and gpus:
            view = replace(view, vram_bytes=tree_vram(view.pids, gpus))
        # The manager samples trees four times a second; a job with a RAM budget is read
        # every tick (its known pids only: new children come with the next tree sample),
        # its shared pages counted once as the manager's last exact reading measured them.
        if view.ram_budget_bytes and view.state in RUNNING_STATES and view.pids:
            rss = self._tree_bytes(view)
            if rss is not None:
                if view.rss_bytes is not None and rss < view.rss_bytes // 2:
                    rss = view.rss_bytes  # members missing from the known pids
                view = replace(view, rss_bytes=rss)
        return view

    def _tree_bytes(self, view: JobView) -> Optional[int]:
        """The job's memory now, each page once (the manager's meter), else its summed RSS."""
        counted = self._acts.tree_bytes(view.id, view.pids) if self._acts is not None else None
        return counted if counted is not None else pids_rss(view.pids)

    def _input(self, snap: Snapshot, jobs: Tuple[JobView, ...]) -> GuardInput:
        fresh = snap.gpus is not self._gpus_seen
        self._gpus_seen = snap.gpus
        return GuardInput(
            snap.time,
            snap.memory,
            tuple(snap.gpus),
            jobs,
            self.foreign.views(jobs, self.policy()),
            gpus_fresh=fresh,
        )

    # -- acting -------------------------------------------------------------------------------

    def _emit(self, kind: str, message: str, **kwargs: Any) -> None:
        # An event that cannot be recorded must not undo the act or its bookkeeping.
        self._parts.run("guard: an event", self._emit_event, kind, message, **kwargs)

    def _carry_out(self, action: Action, inp: GuardInput, policy: Policy) -> None:
        if not action.acts:
            data = action.data
            if action.job_id is None:
                # A machine-wide warning concerns every job: `headroom run` shows it too.
                data = {**data, "job_ids": [j.id for j in inp.jobs if j.state not in ENDED_STATES]}
            self._emit(
                action.event_kind,
                action.message,
                level=action.event_level,
                job_id=action.job_id,
                data=data,
            )
            return
        if action.dry_run:
            self._emit(
                action.event_kind,
                action.message,
                level="info",
                job_id=action.job_id,
                data={**action.data, "dry_run": True},
            )
            self.state = guard.acted(self.state, action, inp.time, policy)
            return
        fresh = self._fresh_input(action, inp)
        self.history.record(fresh)
        holds, why = guard.still_holds(action, fresh, self.history, policy, self.state)
        if not holds:
            log.info("guard: not acting (%s): %s", action.message, why)
            return
        try:
            if action.job_id is not None:
                self._act_on_job(action)
            else:
                self.foreign.act(action)
        except (LookupError, ValueError, psutil.Error, OSError) as e:
            self._refused(action, fresh, policy, e)
            return
        data = dict(action.data)
        data.update(
            available_bytes=fresh.memory.available_bytes,
            total_bytes=fresh.memory.total_bytes,
            psi_full_avg10=fresh.memory.psi_full_avg10,
        )
        self._emit(
            action.event_kind,
            action.message,
            level=action.event_level,
            job_id=action.job_id,
            data=data,
        )
        self.state = guard.acted(self.state, action, fresh.time, policy)

    def _refused(self, action: Action, fresh: GuardInput, policy: Policy, error: Exception) -> None:
        """An act that could not be done: the target is left alone for a moment, and it is
        said (the same failure at most once a minute)."""
        self.state = guard.acted(self.state, action, fresh.time, policy, done=False)
        why = str(error.args[0]) if error.args else type(error).__name__
        last = self._failures.get(action.key)
        now = time.monotonic()
        if last is None or now - last > FAILURE_QUIET_SECONDS:
            self._failures[action.key] = now
            self._emit(
                E.GUARD_WARN,
                guard.text.failed_line(action.kind, action.label, why),
                level="warn",
                job_id=action.job_id,
                data={"cause": action.cause},
            )

    def _fresh_input(self, action: Action, inp: GuardInput) -> GuardInput:
        snap = self._read_snapshot(action.cause == C.BUDGET_VRAM)
        fresh_gpus = snap.gpus is not self._gpus_seen
        self._gpus_seen = snap.gpus
        jobs = self._jobs(snap.gpus)
        return GuardInput(
            snap.time,
            snap.memory,
            tuple(snap.gpus),
            jobs,
            inp.processes,
            gpus_fresh=fresh_gpus or inp.gpus_fresh,
        )

    def _act_on_job(self, action: Action) -> None:
        manager = self._acts
        if manager is None:
            raise Unknown("no job manager")
        ref = action.job_id
        assert ref is not None
        if action.kind == A.PAUSE:
            # At its last resort (no deadline) the job's group is stopped before the manager's
            # bookkeeping, by the manager (trayapp.jobs.trees signals a job's processes).
            manager.pause(
                ref,
                by=BY,
                reason=action.reason,
                deadline=action.deadline_seconds,
                at_once=action.deadline_seconds == 0,
            )
        elif action.kind == A.RESUME:
            manager.resume(ref, by=BY, reason=action.reason)
        elif action.kind == A.PARK:
            manager.park(ref, by=BY, reason=action.reason, smaller=bool(action.data.get("smaller")))
        elif action.kind == A.STOP:
            manager.stop(ref, by=BY, reason=action.reason)

    # -- the status ---------------------------------------------------------------------------

    def _publish(self, d: Decision, policy: Policy, inp: GuardInput) -> None:
        tte = d.seconds_to_exhaustion
        rate = d.fill_rate_bytes_per_s
        self._json = {
            "state": d.state,
            "mode": policy.mode,
            "reasons": list(d.reasons),
            "seconds_to_exhaustion": None if tte is None else round(tte, 2),
            "fill_rate_bytes_per_s": None if rate is None else round(rate),
            "available_bytes": inp.memory.available_bytes,
            "total_bytes": inp.memory.total_bytes,
            "thresholds": d.thresholds.to_json(),
            "psi_full_avg10": inp.memory.psi_full_avg10,
            "top_processes": [
                {
                    "pid": p.pid,
                    "name": p.name,
                    "rss_bytes": p.rss_bytes,
                    "rate_bytes_per_s": None
                    if p.rate_bytes_per_s is None
                    else round(p.rate_bytes_per_s),
                    "job_id": p.job_id,
                }
                for p in sorted(inp.processes, key=lambda p: -p.rss_bytes)[:TOP_LIMIT]
            ]
            if d.wants_processes
            else [],
            "paused_by_guard": dict(self.state.paused_for),
            "suspended_processes": sorted(self.foreign.paused),
            "last_action": self.state.last_action,
        }
