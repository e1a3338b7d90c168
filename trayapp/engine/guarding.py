"""The guard inside the engine: readings in, ``guard.decide`` on them, actions carried out.

``GuardService.step`` runs in the engine's loop thread on every tick, whether or not a client
is connected; the control channel's threads only read ``state_json()``. Before any act (pause,
resume, park, stop) it takes a fresh reading and drops the act when its cause has passed.

It acts on the engine's jobs through the JobManager, and on other processes only where a
``[[guard.rules]]`` entry names them. Those it suspends it also continues when memory is back,
and on ``close()``.
"""

from __future__ import annotations

import fnmatch
import heapq
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import psutil

from trayapp.config import ConfigError
from trayapp.engine import guard
from trayapp.engine.guard import (
    Action,
    Decision,
    FillHistory,
    GuardInput,
    GuardState,
    JobView,
    Policy,
    ProcessView,
    Rule,
)
from trayapp.engine.parts import Parts
from trayapp.probes.processes import tree_vram
from trayapp.probes.snapshot import GpuReading, Snapshot
from trayapp.vocab import EventKind as E
from trayapp.vocab import GuardAct as A
from trayapp.vocab import GuardCause as C
from trayapp.vocab import GuardLevel as L
from trayapp.vocab import GuardMode as M

log = logging.getLogger("headroom.guard")

TOP_LIMIT = 5  # processes named in a warning
TOP_MIN_INTERVAL = 1.0  # the process list is read at most once a second, and only when short
TOP_MAX_AGE = 2.5  # a sample older than this is not shown
FOREIGN_KILL_SECONDS = 5.0  # a process a rule stops gets SIGTERM, then SIGKILL after this
FAILURE_QUIET_SECONDS = 60.0  # the same failed act is reported at most this often
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def job_view(d: Dict[str, Any]) -> JobView:
    """A JobManager job dict as the decision sees it. A job can be parked only with a
    checkpoint folder and the runner's Keras hook (the runner writes the checkpoint)."""
    spec = d.get("spec") or {}
    auto = d.get("auto_resume")
    if auto is None and isinstance(spec, dict):
        auto = spec.get("auto_resume")
    pids = tuple(int(p) for p in (d.get("pids") or ([d["pid"]] if d.get("pid") else [])))
    return JobView(
        id=str(d["id"]),
        name=str(d.get("name") or ""),
        state=str(d.get("state") or ""),
        pids=pids,
        rss_bytes=d.get("rss_bytes"),
        vram_bytes=d.get("vram_bytes"),
        hooked=bool(d.get("hooked")),
        checkpoint=bool(d.get("checkpoint_dir")) and bool(d.get("hooked")),
        ram_budget_bytes=d.get("ram_budget_bytes"),
        vram_budget_bytes=d.get("vram_budget_bytes"),
        paused_by=d.get("paused_by"),
        auto_resume=None if auto is None else bool(auto),
        parked_by=d.get("park_by") if d.get("state") == "parked" else None,
    )


def pids_rss(pids: Sequence[int]) -> Optional[int]:
    """The summed RSS of ``pids`` (the ones still there); None when none is readable.

    On Linux one small read of ``/proc/<pid>/statm`` each, cheap enough for every tick."""
    total = 0
    found = False
    for pid in pids:
        rss = None
        if sys.platform.startswith("linux"):
            try:
                with open(f"/proc/{pid}/statm", "rb") as f:
                    rss = int(f.read().split()[1]) * _PAGE
            except (OSError, ValueError, IndexError):
                rss = None
        else:
            try:
                rss = int(psutil.Process(pid).memory_info().rss)
            except psutil.Error:
                rss = None
        if rss is not None:
            total += rss
            found = True
    return total if found else None


class GuardService:
    """The engine-side guard. ``engine`` gives ``config``, ``jobs`` (a JobManager or None),
    ``emit_event``, ``read_snapshot`` and ``clock``."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.history = FillHistory()
        self.state = GuardState()
        self._lock = threading.RLock()
        self._config_seen: Any = None
        self._policy = Policy()
        self._last_input: Optional[GuardInput] = None
        self._last_decision: Optional[Decision] = None
        self._interval: Optional[float] = None
        self._gpus_seen: Any = None
        self._top: List[Tuple[int, str, int, float, Optional[float]]] = []
        self._top_at = -1e18  # monotonic time of the last process sample
        self._top_prev: Dict[int, Tuple[float, int, float]] = {}  # pid -> (t, rss, created)
        self._foreign_paused: Dict[int, Tuple[float, str, int]] = {}  # pid -> (created, name,
        # rss)
        self._foreign_stops: Dict[int, Tuple[float, float]] = {}  # pid -> (kill at, created)
        self._created: Dict[int, float] = {}
        self._failures: Dict[str, float] = {}
        self._self_pid = os.getpid()
        self._parts = Parts(log)  # what is not the ladder itself, each part on its own
        self._json: Dict[str, Any] = {"state": L.OK, "mode": self.policy().mode, "reasons": [],
                                      "seconds_to_exhaustion": None,
                                      "fill_rate_bytes_per_s": None}

    # -- what the engine calls ----------------------------------------------------------------

    def handlers(self) -> Dict[str, Callable[[Any, Dict[str, Any]], Any]]:
        """Control-channel ops: ``guard`` answers the guard's part of the status."""
        return {"guard": lambda peer, args: self.state_json()}

    def policy(self) -> Policy:
        """The policy for the engine's current settings (rebuilt when they are reloaded)."""
        cfg = self.engine.config
        if cfg is not self._config_seen:
            try:
                self._policy = Policy.from_config(cfg)
            except (ConfigError, KeyError, ValueError, TypeError) as e:
                log.warning("guard settings unusable (%s); keeping the previous ones", e)
            self._config_seen = cfg
        return self._policy

    def wants_gpus(self) -> bool:
        """Whether the next tick should read the GPUs too (VRAM is near a threshold)."""
        return guard.wants_gpus(self._last_input, self.policy())

    def next_interval(self, base: float) -> float:
        """Seconds until the next tick (see ``guard.next_interval``)."""
        if not self._lock.acquire(blocking=False):
            return self._interval if self._interval is not None else base
        try:
            self._interval = guard.next_interval(self._last_input, self.history, self.policy(),
                                                 base, self.state)
            return self._interval
        finally:
            self._lock.release()

    def state_json(self) -> Dict[str, Any]:
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
            for pid, (created, name, _) in list(self._foreign_paused.items()):
                proc = self._same(pid, created)
                if proc is not None:
                    try:
                        proc.resume()
                        log.info("continued %s (pid %d) on the way out", name, pid)
                    except psutil.Error:
                        pass
            self._foreign_paused.clear()

    # -- one tick -----------------------------------------------------------------------------

    def _step(self, snap: Snapshot) -> None:
        policy = self.policy()
        jobs = self._jobs(snap.gpus)
        inp = self._input(snap, jobs)
        self.history.record(inp)
        d = guard.decide(inp, self.history, policy, self.state)
        if d.wants_processes and policy.mode != M.OFF and \
                time.monotonic() - self._top_at >= TOP_MIN_INTERVAL:
            if self._parts.run("guard: the process list", self._sample_processes, jobs, policy):
                inp = replace(inp, processes=self._processes(jobs, policy))
                d = guard.decide(inp, self.history, policy, self.state)
        self.state = d.next
        self._last_input = inp
        for action in d.actions:
            try:
                self._carry_out(action, inp, policy)
            except Exception:
                log.exception("guard: %s failed", action.message)
        self._parts.run("guard: foreign processes", self._tend_foreign)
        self._last_decision = d
        self._parts.run("guard: the status", self._publish, d, policy, inp)

    def _jobs(self, gpus: Sequence[GpuReading] = ()) -> Tuple[JobView, ...]:
        """The jobs as the ladder sees them: the manager's own fields of each (never what a job
        sent), their RSS read again where a budget needs it. When the manager cannot answer,
        the jobs of the last tick, with their RSS read again."""
        manager = self.engine.jobs
        if manager is None:
            return ()
        try:
            records: Sequence[Any] = manager.guard_jobs()
            self._parts.worked("guard: the job list")
        except Exception as e:
            self._parts.failed("guard: the job list", e)
            records = self._last_input.jobs if self._last_input is not None else ()
        views = []
        for d in records:
            try:
                views.append(self._job_view(d, gpus))
            except Exception as e:
                self._parts.failed("guard: a job's record", e)
        return tuple(views)

    def _job_view(self, d: Any, gpus: Sequence[GpuReading]) -> JobView:
        view = d if isinstance(d, JobView) else job_view(d)
        # VRAM from this tick's GPU readings (read every tick near a VRAM threshold).
        if view.vram_budget_bytes and view.pids and gpus:
            view = replace(view, vram_bytes=tree_vram(view.pids, gpus))
        # The manager samples trees four times a second; a job with a RAM budget is read
        # every tick (its known pids only: new children come with the next tree sample),
        # its shared pages counted once as the manager's last exact reading measured them.
        if view.ram_budget_bytes and view.state in guard.RUNNING_STATES and view.pids:
            rss = self._tree_bytes(view)
            if rss is not None:
                if view.rss_bytes is not None and rss < view.rss_bytes // 2:
                    rss = view.rss_bytes  # members missing from the known pids
                view = replace(view, rss_bytes=rss)
        return view

    def _tree_bytes(self, view: JobView) -> Optional[int]:
        """The job's memory now, each page once (the manager's meter), else its summed RSS."""
        reader = getattr(self.engine.jobs, "tree_bytes", None)
        counted = reader(view.id, view.pids) if reader is not None else None
        return counted if counted is not None else pids_rss(view.pids)

    def _input(self, snap: Snapshot, jobs: Tuple[JobView, ...]) -> GuardInput:
        fresh = snap.gpus is not self._gpus_seen
        self._gpus_seen = snap.gpus
        return GuardInput(snap.time, snap.memory, tuple(snap.gpus), jobs,
                          self._processes(jobs, self.policy()), gpus_fresh=fresh)

    # -- acting -------------------------------------------------------------------------------

    def _emit(self, kind: str, message: str, **kwargs: Any) -> None:
        # An event that cannot be recorded must not undo the act or its bookkeeping.
        self._parts.run("guard: an event", self.engine.emit_event, kind, message, **kwargs)

    def _carry_out(self, action: Action, inp: GuardInput, policy: Policy) -> None:
        emit = self._emit
        if not action.acts:
            data = action.data
            if action.job_id is None:
                # A machine-wide warning concerns every job: `headroom run` shows it too.
                data = {**data, "job_ids": [j.id for j in inp.jobs
                                            if j.state not in guard.ENDED_STATES]}
            emit(action.event_kind, action.message, level=action.event_level,
                 job_id=action.job_id, data=data)
            return
        if action.dry_run:
            emit(action.event_kind, action.message, level="info", job_id=action.job_id,
                 data={**action.data, "dry_run": True})
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
                self._act_on_process(action)
        except (LookupError, ValueError, psutil.Error, OSError) as e:
            self.state = guard.acted(self.state, action, fresh.time, policy, done=False)
            text = str(e.args[0]) if e.args else type(e).__name__
            last = self._failures.get(action.key)
            now = time.monotonic()
            if last is None or now - last > FAILURE_QUIET_SECONDS:
                self._failures[action.key] = now
                emit(E.GUARD_WARN, f"could not {action.kind} {action.label}: {text}",
                     level="warn", job_id=action.job_id, data={"cause": action.cause})
            return
        data = dict(action.data)
        data.update(available_bytes=fresh.memory.available_bytes,
                    total_bytes=fresh.memory.total_bytes,
                    psi_full_avg10=fresh.memory.psi_full_avg10)
        emit(action.event_kind, action.message, level=action.event_level,
             job_id=action.job_id, data=data)
        self.state = guard.acted(self.state, action, fresh.time, policy)

    def _fresh_input(self, action: Action, inp: GuardInput) -> GuardInput:
        snap = self.engine.read_snapshot(gpus_now=action.cause == C.BUDGET_VRAM)
        fresh_gpus = snap.gpus is not self._gpus_seen
        self._gpus_seen = snap.gpus
        jobs = self._jobs(snap.gpus)
        return GuardInput(snap.time, snap.memory, tuple(snap.gpus), jobs, inp.processes,
                          gpus_fresh=fresh_gpus or inp.gpus_fresh)

    def _act_on_job(self, action: Action) -> None:
        manager = self.engine.jobs
        if manager is None:
            raise LookupError("no job manager")
        ref = action.job_id
        if action.kind == A.PAUSE:
            group = self._stop_group_now(action) if action.deadline_seconds == 0 else None
            try:
                manager.pause(ref, by="guard", reason=action.reason,
                              deadline=action.deadline_seconds)
            except BaseException:
                if group is not None:
                    _signal_group(group, signal.SIGCONT)  # the manager refused: undo
                raise
        elif action.kind == A.RESUME:
            manager.resume(ref, by="guard", reason=action.reason)
        elif action.kind == A.PARK:
            manager.park(ref, by="guard", reason=action.reason)
        elif action.kind == A.STOP:
            manager.stop(ref, by="guard", reason=action.reason)

    def _stop_group_now(self, action: Action) -> Optional[int]:
        """SIGSTOP the job's process group at once, before the manager's bookkeeping (its
        lock, a walk of the tree, a write to the store) delays the suspend by milliseconds of
        growth. The manager then suspends the whole tree as usual. Returns the group, or None
        where there is none to stop (Windows, a job that is gone)."""
        if sys.platform == "win32" or self._last_input is None:
            return None
        job = next((j for j in self._last_input.jobs if j.id == action.job_id), None)
        if job is None or not job.pids:
            return None
        group = job.pids[0]  # jobs start in their own session: the root leads the group
        try:
            if os.getpgid(group) != group:
                return None
        except OSError:
            return None
        return group if _signal_group(group, signal.SIGSTOP) else None

    def _act_on_process(self, action: Action) -> None:
        pid = action.pid
        assert pid is not None
        created = self._created.get(pid)
        if created is None and pid in self._foreign_paused:
            created = self._foreign_paused[pid][0]
        proc = self._same(pid, created)
        if proc is None or pid == self._self_pid:
            raise LookupError(f"process {pid} is gone")
        if action.kind == A.PAUSE:
            proc.suspend()
            rss = int(action.data.get("rss_bytes") or 0)
            self._foreign_paused[pid] = (proc.create_time(), proc.name(), rss)
        elif action.kind == A.RESUME:
            proc.resume()
            self._foreign_paused.pop(pid, None)
        elif action.kind == A.STOP:
            if pid in self._foreign_paused:
                proc.resume()  # a stopped process cannot act on SIGTERM
                self._foreign_paused.pop(pid, None)
            proc.terminate()
            self._foreign_stops[pid] = (time.monotonic() + FOREIGN_KILL_SECONDS,
                                        proc.create_time())

    def _same(self, pid: int, created: Optional[float]) -> Optional[psutil.Process]:
        """The process ``pid`` if it is still the one seen (same start time); else None."""
        try:
            proc = psutil.Process(pid)
            if created is not None and abs(proc.create_time() - created) > 0.01:
                return None
            return proc
        except psutil.Error:
            return None

    def _tend_foreign(self) -> None:
        """Finish stops (SIGKILL once the grace has passed); forget processes that ended."""
        if self._foreign_stops:
            now = time.monotonic()
            for pid, (when, created) in list(self._foreign_stops.items()):
                proc = self._same(pid, created)
                if proc is None:
                    del self._foreign_stops[pid]
                elif now >= when:
                    try:
                        proc.kill()
                    except psutil.Error:
                        pass
                    del self._foreign_stops[pid]
        for pid, (created, _, _) in list(self._foreign_paused.items()):
            if self._same(pid, created) is None:
                del self._foreign_paused[pid]

    # -- other processes ----------------------------------------------------------------------

    def _sample_processes(self, jobs: Sequence[JobView], policy: Policy) -> None:
        """Read the process list once: the largest by RSS, and any a rule names."""
        self._top_at = time.monotonic()
        now = time.time()
        rows: List[Tuple[int, str, int, float]] = []
        for proc in psutil.process_iter(["name", "memory_info", "create_time"]):
            info = proc.info
            mem = info.get("memory_info")
            if mem is None:
                continue
            rows.append((proc.pid, info.get("name") or "", int(mem.rss),
                         float(info.get("create_time") or 0.0)))
        keep = {r[0]: r for r in heapq.nlargest(TOP_LIMIT, rows, key=lambda r: r[2])}
        if policy.rules:
            for r in rows:
                if r[0] not in keep and _rule_for(r[1], policy.rules) is not None:
                    keep[r[0]] = r
        prev = self._top_prev
        top: List[Tuple[int, str, int, float, Optional[float]]] = []
        for pid, name, rss, created in keep.values():
            rate = None
            before = prev.get(pid)
            if before is not None and before[2] == created and now > before[0]:
                rate = (rss - before[1]) / (now - before[0])
            top.append((pid, name, rss, created, rate))
        self._top = top
        self._top_prev = {pid: (now, rss, created) for pid, _, rss, created, _ in top}
        self._created = {pid: created for pid, _, _, created, _ in top}

    def _processes(self, jobs: Sequence[JobView], policy: Policy) -> Tuple[ProcessView, ...]:
        owner = {pid: j.id for j in jobs for pid in j.pids}
        out: Dict[int, ProcessView] = {}
        if time.monotonic() - self._top_at <= TOP_MAX_AGE:
            for pid, name, rss, _, rate in self._top:
                job_id = owner.get(pid)
                rule = None if job_id or pid == self._self_pid else _rule_for(name, policy.rules)
                out[pid] = ProcessView(pid, name, rss, rate, job_id, rule,
                                       pid in self._foreign_paused)
        for pid, (_, name, rss) in self._foreign_paused.items():
            if pid not in out:
                out[pid] = ProcessView(pid, name, rss, None, None,
                                       _rule_for(name, policy.rules), True)
        return tuple(out.values())

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
                {"pid": p.pid, "name": p.name, "rss_bytes": p.rss_bytes,
                 "rate_bytes_per_s": None if p.rate_bytes_per_s is None
                 else round(p.rate_bytes_per_s), "job_id": p.job_id}
                for p in sorted(inp.processes, key=lambda p: -p.rss_bytes)[:TOP_LIMIT]
            ] if d.wants_processes else [],
            "paused_by_guard": dict(self.state.paused_for),
            "suspended_processes": sorted(self._foreign_paused),
            "last_action": self.state.last_action,
        }


def _signal_group(group: int, sig: int) -> bool:
    try:
        os.killpg(group, sig)
        return True
    except OSError:
        return False


def _rule_for(name: str, rules: Sequence[Rule]) -> Optional[Rule]:
    for rule in rules:
        if fnmatch.fnmatch(name, rule.pattern):
            return rule
    return None
