"""Start, watch, pause, resume, park and stop training jobs (whole process trees); their logs.

Every job runs in its own session (process group), with stdout and stderr in
``jobs/<id>/log``, and talks to the engine over its own channel (``paths.job_address(id)``,
authenticated with a key kept in ``jobs/<id>/key``, 0600). The runner inside the job is the
channel's client; it reconnects when the engine comes back, so an engine that restarts takes
its jobs back (``adopt``). An engine that goes away never ends a job.

Threads: the engine loop calls ``tick``; control-channel threads call the actions; each job's
channel has threads of its own. One lock guards every job's state. No action blocks: stop
escalation, pause deadlines and reaping all advance in ``tick``.

A parked job that is resumed is relaunched under the same id (same folder, log and channel,
``runs`` counts the launches) with its spec's ``resume`` set, so the runner continues from the
checkpoint. So is a stopped job that has a checkpoint folder: the runner's stop saves where
training is, ends ``fit()`` and exits with ``STOP_EXIT_CODE`` before the rest of the script.

The parts, each an object holding the one table of jobs: ``table`` (the jobs, the store),
``runner_link`` (the runner's messages), ``braking`` (each job's cgroups and the kernel
brake), ``starting`` (launching), ``control`` (pause, resume, park, stop), ``kernels``
(Jupyter kernels); and pure helpers: ``ladder`` (the stop's steps), ``transitions`` (the
state changes), ``endings`` (how a job ended); ``trees`` (process trees, the one place a
job's processes are signalled), ``logpages`` (logs), ``eta``. This module makes the parts
and ties them up.
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import psutil

from trayapp import config as configmod
from trayapp import vocab
from trayapp.channel import Peer
from trayapp.config import Paths
from trayapp.errors import Refused
from trayapp.jobs import ladder, logpages, trees
from trayapp.jobs.brake_ends import BrakeEnd
from trayapp.jobs.braking import Brakes
from trayapp.jobs.cgroups import Offer
from trayapp.jobs.control import Controller
from trayapp.jobs.endings import Ending, bye_code, ending
from trayapp.jobs.job import BY_ENGINE, BY_USER, Emit, Event, Job, now
from trayapp.jobs.kernels import KernelJobs
from trayapp.jobs.ladder import Stage
from trayapp.jobs.logcap import LogKeeper
from trayapp.jobs.record import JobRecord
from trayapp.jobs.runner_link import RunnerLink
from trayapp.jobs.starting import Launcher
from trayapp.jobs.table import JobTable
from trayapp.jobs.transitions import ENDS
from trayapp.jsonvalue import JSONObject
from trayapp.readings import GpuReading, Snapshot
from trayapp.request_args import Args, Handlers
from trayapp.text import one_line
from trayapp.vocab import EventKind as E
from trayapp.vocab import JobState as S

log = logging.getLogger("headroom.jobs")

SAMPLE_INTERVAL = 0.25  # psutil reads a job's tree at most 4 times a second
SAVE_INTERVAL = 5.0  # progress reaches the store at most this often (state changes at once)
LIST_LIMIT = 200  # ended jobs ``list`` reads from the store
ADOPT_LIMIT = 1000  # live and parked jobs ``adopt`` reads from the store
STOP_ALL_POLL_SECONDS = 0.05
STOP_ALL_KILL_WAIT_SECONDS = 2.0  # after SIGKILL to what is left, when the engine exits
LOG_MAX_MB = 32  # the log cap of a job launched before the cap was kept with it


def _may_resume(data: Any) -> bool:
    """A saved row that may be a stopped job to resume (its record then says for sure)."""
    return (
        isinstance(data, dict) and data.get("state") == S.STOPPED and data.get("resumable") is True
    )


class JobManager:
    """The engine's jobs. See the module docstring for threads and life cycle.

    ``emit(kind, message, *, level, job_id, data)`` records and pushes an event; ``gpus()``
    returns the engine's latest GPU readings; ``config()`` its current settings.

    Built of parts that each hold the one table of jobs (``table``): ``brakes``, ``link``,
    ``launcher``, ``kernels`` and ``control``; this object makes them, takes the engine's
    calls to them, and watches the jobs (``tick``), takes them back (``adopt``) and lets them
    go (``close``).
    """

    def __init__(
        self,
        paths: Paths,
        store: Any,
        *,
        emit: Emit,
        gpus: Callable[[], Iterable[GpuReading]] = lambda: (),
        config: Callable[[], Any] = lambda: configmod.Config(),
        runner_dir: Optional[Path] = None,
        subreaper: bool = True,
        wake: Callable[[], None] = lambda: None,
    ):
        self.table = JobTable(
            paths, store, emit=emit, gpus=gpus, config=config, runner_dir=runner_dir, wake=wake
        )
        self.paths, self.store = paths, store
        self.brakes = Brakes(self.table)
        self.link = RunnerLink(self.table)
        self.launcher = Launcher(self.table, self.link, self.brakes)
        self.kernels = KernelJobs(self.table, self.link, self.launcher, self.brakes)
        self.control = Controller(self.table, self.launcher, self.brakes, self.kernels)
        self.link.kernel_idle = self.kernels.fit_ended  # an interrupted fit has ended
        self.subreaper = trees.become_subreaper() if subreaper else False
        self.curves = self.link.curves  # each job's loss and metrics, for the jobs window
        # Each running job's log is kept under its cap (jobs.log_max_mb) by its own thread.
        self._log_keeper = LogKeeper(self._running_logs)
        self._log_keeper.start()

    # -- the parts' calls ---------------------------------------------------------------------

    def start(
        self,
        spec_json: Dict[str, Any],
        environ: Optional[Dict[str, Any]] = None,
        env_from: Optional[str] = None,
    ) -> JobRecord:
        """Start a job (``Launcher.start``)."""
        return self.launcher.start(spec_json, environ, env_from)

    def pause(
        self,
        job_ref: str,
        *,
        by: str = BY_USER,
        reason: str = "",
        deadline: Optional[float] = None,
        at_once: bool = False,
    ) -> JobRecord:
        """Pause a job (``Controller.pause``). ``at_once`` (the guard's last resort, by the
        job's id): its process group is stopped before anything else (``trees.
        stop_group_now``), and continued again when the pause is refused."""
        leader = 0
        if at_once:
            job = self.table.jobs.get(job_ref)  # no lock: the stop comes before the bookkeeping
            leader = trees.stop_group_now(job.rec) if job is not None else 0
        try:
            return self.control.pause(job_ref, by=by, reason=reason, deadline=deadline)
        except BaseException:
            if leader:
                trees.continue_group(leader)  # refused: undone
            raise

    def resume(self, job_ref: str, *, by: str = BY_USER, reason: str = "") -> JobRecord:
        """Resume, or relaunch, a job (``Controller.resume``)."""
        return self.control.resume(job_ref, by=by, reason=reason)

    def park(
        self, job_ref: str, *, by: str = BY_USER, reason: str = "", smaller: bool = False
    ) -> JobRecord:
        """Park a job; a kernel's fit is interrupted (``Controller.park``)."""
        return self.control.park(job_ref, by=by, reason=reason, smaller=smaller)

    def stop(
        self, job_ref: str, *, by: str = BY_USER, reason: str = "", force: bool = False
    ) -> JobRecord:
        """Stop a job in steps (``Controller.stop``)."""
        return self.control.stop(job_ref, by=by, reason=reason, force=force)

    def kill(self, job_ref: str, *, by: str = BY_USER, reason: str = "") -> JobRecord:
        """``stop`` straight to SIGKILL."""
        return self.control.kill(job_ref, by=by, reason=reason)

    def interrupt(self, job_ref: str, *, by: str = BY_USER, reason: str = "") -> JobRecord:
        """Interrupt a kernel's fit (``KernelJobs.interrupt``)."""
        return self.kernels.interrupt(job_ref, by=by, reason=reason)

    def pause_all(self, *, by: str = BY_USER, reason: str = "") -> List[JobRecord]:
        """Pause every running job; returns their records."""
        return self.control.pause_all(by=by, reason=reason)

    def adopt_kernel(self, peer: Peer, args: Args) -> JSONObject:
        """Make the asking kernel a job (``KernelJobs.adopt_kernel``)."""
        return self.kernels.adopt_kernel(peer, args)

    def kernel_handlers(self) -> Handlers:
        return self.kernels.kernel_handlers()

    def cgroup_offer(self) -> Offer:
        """What this machine offers the jobs (``Brakes.cgroup_offer``)."""
        return self.brakes.cgroup_offer()

    def protection(self) -> Dict[str, Any]:
        """The protection new jobs get here, for the status."""
        return self.brakes.protection()

    # -- the engine's calls -------------------------------------------------------------------

    def handlers(self) -> Handlers:
        """The control-channel ops this manager answers: ``{op: fn(peer, args)}``."""
        return {
            "jobs": lambda peer, a: [
                r.to_json() for r in self.list(include_finished=a.flag("all"))
            ],
            "job_get": self._op_job_get,
            "job_start": lambda peer, a: self.start(
                a.object("spec"), environ=a.opt_object("environ"), env_from=a.opt_text("env_from")
            ).to_json(),
            "job_action": self.control.op_action,
            "job_log": lambda peer, a: self.log(
                a.text("job"), a.opt_int("offset"), a.opt_int("max_bytes")
            ).to_json(),
            "jobs_pause_all": lambda peer, a: [r.to_json() for r in self.pause_all(by=BY_USER)],
            **self.kernel_handlers(),
        }

    def list(self, include_finished: bool = False) -> List[JobRecord]:
        """Job records, newest first: live and parked jobs, stopped ones that can still be
        resumed (a checkpoint to continue from), and with ``include_finished`` every ended one
        the store keeps."""
        with self.table.lock:
            out = {j.id: j.rec for j in self.table.jobs.values()}
            recent = dict(self.table.ended)
        resumable = None if include_finished else _may_resume
        for rec in self.table.stored_list(True, LIST_LIMIT, resumable):
            if include_finished or (rec.resumable and rec.state == S.STOPPED):
                out.setdefault(rec.id, rec)
        for k, v in recent.items():
            if include_finished or (v.resumable and v.state == S.STOPPED):
                if k not in out or out[k].state in vocab.LIVE:
                    out[k] = v
        return sorted(out.values(), key=lambda r: -(r.started or 0))

    def guard_jobs(self) -> List[JobRecord]:
        """The records of the live and parked jobs, as the guard's ladder reads them (frozen:
        nothing the guard does changes them, and nothing a job sends can make this fail). A
        run the kernel brake is ending is left out: it is relaunched smaller at once."""
        with self.table.lock:
            return [
                job.rec for job in self.table.jobs.values() if not self.brakes.brake_ending_now(job)
            ]

    def get(self, job_ref: str) -> JobRecord:
        """The job's record for an id, a unique id prefix or a unique name.

        Raises LookupError ("no job named x" / "x matches 2 jobs (...)")."""
        with self.table.lock:
            job = self.table.find(job_ref)
            return job.rec if isinstance(job, Job) else job

    def _op_job_get(self, peer: Peer, args: Args) -> JSONObject:
        """``job_get``: the job's JSON; with ``curves``, its loss and metric curves under
        ``"curves"`` (``Curves.get``)."""
        rec = self.get(args.text("job"))
        found = rec.to_json()
        if args.flag("curves"):
            found["curves"] = self.link.curves.get(rec.id).to_json()
        return found

    def tree_bytes(self, job_id: str, pids: Sequence[int]) -> Optional[int]:
        """A job's memory now from its processes ``pids``, each page counted once as of the
        last exact reading (cheap enough for every guard tick); None for a job not watched or
        no readable process."""
        with self.table.lock:
            job = self.table.jobs.get(job_id)
            meter = job.meter if job is not None else None
        if job is not None and job.cgroup is not None:
            exact = self.brakes.cgroup_bytes(job)  # its cgroup's own count, where it has one
            if exact:  # 0: nothing charged to it yet (a process just moved in): its RSS
                return exact
        if meter is None:
            return None
        return meter.read(pids)

    def active_count(self) -> int:
        """Jobs with a process (parked ones have none)."""
        with self.table.lock:
            return sum(1 for j in self.table.jobs.values() if j.state in vocab.LIVE)

    # -- adoption -----------------------------------------------------------------------------

    def adopt(self) -> List[str]:
        """Take back the jobs an earlier engine left: live ones get their channel back (same
        address, same key) and are watched with psutil; parked ones wait for ``resume``; the
        rest end as "lost", or as the runner's ``bye`` said. A saved record that cannot be read
        is left out (logged). Returns the adopted ids."""
        adopted: List[str] = []
        saved = self.table.store.list_jobs(include_finished=False, limit=ADOPT_LIMIT, adopting=True)
        for rec in saved:
            with self.table.lock:
                if rec.id in self.table.jobs or not self._adopt(rec):
                    continue
            adopted.append(rec.id)
            self.table.emit(
                E.JOB_ADOPTED,
                f"job {rec.id} ({rec.name}) is watched again (pid {rec.pid}, {rec.state})",
                job_id=rec.id,
            )
        return adopted

    def _adopt(self, rec: JobRecord) -> bool:
        """Take one saved job back (under the lock); True for a live one now watched."""
        try:
            key = (self.table.paths.jobs_dir / rec.id / "key").read_bytes()
        except OSError:
            key = b""
        job = Job(rec, key)
        if rec.state in vocab.PARKED:
            self.table.jobs[rec.id] = job
            return False
        if rec.state not in vocab.LIVE:
            return False
        proc = trees.same_process(rec.pid, rec.create_time)
        if proc is None:
            self._end(job, None, adopted_gone=True)
            return False
        job.process = proc
        job.known = {proc.pid: proc}
        job.change(connected=False)
        self.brakes.cgroup_adopt(job)
        try:
            if not key:
                raise Refused("its key is missing")
            self.link.open_channel(job)
        except ValueError as e:
            log.warning("job %s: %s; it runs on without progress reports", rec.id, e)
        self.table.jobs[rec.id] = job
        if rec.state == S.PAUSING:
            job.pause_deadline = time.monotonic() + self.table.pause_deadline(None)
        elif rec.state == S.STOPPING:
            job.stop_note = (rec.stopped_by or BY_USER, rec.stop_reason or "")
            self.control.take_step(job, ladder.step(Stage.INT, time.monotonic()))
        return True

    # -- the loop -----------------------------------------------------------------------------

    def tick(self, snapshot: Optional[Snapshot] = None) -> None:
        """Reap ended jobs, sample each tree's memory (at most 4 Hz), move stops and pause
        deadlines along, save progress. Cheap when nothing is due."""
        gpus: Tuple[GpuReading, ...] = (
            tuple(snapshot.gpus) if snapshot is not None else tuple(self.table.gpus())
        )
        if snapshot is not None:
            self.table.memory_total = snapshot.memory.total_bytes  # cgroup-aware
            self.table.snapshot = snapshot
        events: List[Event] = []
        with self.table.lock:
            t = time.monotonic()
            for job in list(self.table.jobs.values()):
                if job.state not in vocab.LIVE:
                    continue
                try:
                    self._tick_job(job, t, gpus, events)
                except Exception:  # one job's trouble must not stop the others' watch
                    log.exception("job %s: watching failed", job.id)
            if self.table.orphans.due(t):
                self._reap_orphans()
        self.table.flush_events(events)

    def _reap_orphans(self) -> None:
        self.table.orphans.reap(
            {j.popen.pid for j in self.table.jobs.values() if j.popen is not None}
        )

    def _tick_job(
        self, job: Job, t: float, gpus: Tuple[GpuReading, ...], events: List[Event]
    ) -> None:
        if not job.exit_seen:
            code, gone = self._poll_exit(job)
            if gone:
                job.exit_seen = True
                job.change(exit_code=code, pids=())
        if job.exit_seen:
            # A stop ends only when the whole tree is gone; anything else ends with its root.
            if job.state == S.STOPPING and trees.remnants(job):
                self.control.advance_stop(job, t, runner_gone=True)  # no one left to ask
                return
            if job.state == S.PARKING:
                trees.end_remnants(job)
            self._end(job, job.rec.exit_code, events=events)
            return
        if t >= job.next_sample:
            job.next_sample = t + SAMPLE_INTERVAL
            trees.sample(job, gpus, exact=self.brakes.exact_readings(job))
        self.brakes.brake(job, t, events)  # every tick: the limit follows what the machine has
        if not job.rec.answering:
            self._without_runner(job, t, events)
        if job.state == S.PAUSING and job.pause_deadline is not None and t >= job.pause_deadline:
            self.control.suspend(job, events, why="the pause deadline passed")
        if job.state == S.STOPPING:
            self.control.advance_stop(job, t)
        if job.dirty and t - job.last_saved >= SAVE_INTERVAL:
            self.table.save(job)

    def _without_runner(self, job: Job, t: float, events: List[Event]) -> None:
        """A job that does not answer gets what was asked of its runner by signals: a pause
        or a park under way becomes a suspend of its tree (a park needs the runner), a stop
        goes on to its signals."""
        if job.state == S.PAUSING:
            self.control.suspend(job, events, why="it does not answer")
        elif job.state == S.PARKING and not job.rec.is_kernel:
            by, why = job.park_note
            job.change(paused_by=by, pause_reason=why or None, paused_at=now())
            job.smaller = None
            self.control.suspend(job, events, why="it does not answer, so it cannot park")
        elif job.state == S.STOPPING and job.stop_stage == Stage.ASK:
            self.control.take_step(job, ladder.step(Stage.INT, t))

    def _poll_exit(self, job: Job) -> Tuple[Optional[int], bool]:
        """(exit code or None when unknown, whether the root process is gone)."""
        if job.popen is not None:
            rc = job.popen.poll()
            return rc, rc is not None
        proc = job.process
        if proc is None:
            return bye_code(job.rec), True
        try:
            gone = not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            gone = True
        return (bye_code(job.rec) if gone else None), gone

    def _end(
        self,
        job: Job,
        code: Optional[int],
        *,
        events: Optional[List[Event]] = None,
        adopted_gone: bool = False,
    ) -> None:
        """Record how the job ended, close its channel and move it out of the live set; one
        that the kernel brake ended (or the OOM killer) is relaunched smaller at once."""
        brake = self.brakes.brake_ending(job, code)
        self.brakes.cgroup_release(job)
        end: Union[Ending, BrakeEnd] = (
            brake
            if brake is not None
            else ending(job.rec, code, job.park_note, job.stop_note, adopted_gone)
        )
        self.table.move(job, ENDS[end.state], reason=end.reason, exit_code=code, ended=now())
        self.link.close_channel(job)
        job.popen = None
        trees.remnants(job)
        self.table.orphans.procs.update(job.known)  # what still runs, or waits to be reaped
        job.process = None
        job.known = {}
        self.table.save(job)
        if end.state != S.PARKED:
            self.table.retire(job)
        data: JSONObject = {"state": end.state, "exit_code": code, "end_reason": end.reason}
        event: Event = (end.kind, end.level, end.message, job.id, data)
        smaller, job.smaller = job.smaller, None
        if brake is not None and brake.accumulation:
            self.table.flush_events([event])  # braked, then relaunched: in that order
            self._relaunch_braked(job, brake.accumulation, brake.from_checkpoint, brake.cause)
        elif end.state == S.PARKED and smaller:
            self.table.flush_events([event])  # parked, then relaunched: in that order
            self._relaunch_smaller(job, smaller)
        elif events is not None:
            events.append(event)
        else:
            self.table.flush_events([event])

    def _relaunch_smaller(self, job: Job, accumulation: int) -> None:
        """A job parked to shrink is relaunched at once, without waiting for memory."""
        by, why = job.park_note
        try:
            self.launcher.relaunch(job, by, why or "smaller, to fit", accumulation=accumulation)
        except ValueError as e:
            self.table.emit(
                E.JOB_NOTE,
                f"job {job.id} ({job.rec.name}) stays parked: {one_line(e)}",
                level="warn",
                job_id=job.id,
            )

    def _relaunch_braked(
        self, job: Job, accumulation: int, from_checkpoint: bool, reason: str
    ) -> None:
        """A job the kernel brake ended is relaunched at once at half its micro-batch."""
        try:
            self.launcher.relaunch(
                job, BY_ENGINE, reason, accumulation=accumulation, from_checkpoint=from_checkpoint
            )
        except ValueError as e:
            self.table.emit(
                E.JOB_NOTE,
                f"job {job.id} ({job.rec.name}) stays parked: {one_line(e)}",
                level="warn",
                job_id=job.id,
            )

    # -- the engine's last calls --------------------------------------------------------------

    def stop_all(self, reason: str, timeout: float = 7.0) -> None:
        """Stop every live job and wait (up to ``timeout`` seconds) until they have ended;
        what is left then is killed. Starts at SIGINT: the engine is on its way out."""
        with self.table.lock:
            for job in list(self.table.jobs.values()):
                if job.state in vocab.LIVE:
                    self.control.begin_stop(job, BY_ENGINE, reason, force=False, ask=False)
        self._wait_ended(timeout)
        with self.table.lock:
            for job in list(self.table.jobs.values()):
                if job.state in vocab.LIVE:
                    self.control.take_step(job, ladder.step(Stage.KILL, time.monotonic()))
        self._wait_ended(STOP_ALL_KILL_WAIT_SECONDS)

    def _wait_ended(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and self.active_count():
            self.tick(None)
            time.sleep(STOP_ALL_POLL_SECONDS)

    def close(self) -> None:
        """The engine exits: close every job's channel and save its state. The jobs keep
        running; the next engine adopts them."""
        self._log_keeper.close()
        with self.table.lock:
            self.table.closed = True
            # What ended jobs left to this process (as their subreaper) is collected now: once
            # it exits, a zombie would pass to whoever is next up the tree.
            self._reap_orphans()
            for job in self.table.jobs.values():
                if job.server is not None:
                    job.server.close()
                    job.server = None
                job.peer = None
                if job.popen is not None:
                    # Let go of the child: it runs on, and a later engine adopts it.
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", ResourceWarning)
                        job.popen = None
                if job.state in vocab.LIVE:
                    self.brakes.cgroup_hand_over(job)  # frozen: stopped by signal, killable
                    job.change(connected=False)
                    self.table.save(job)

    # -- logs ---------------------------------------------------------------------------------

    def log(
        self, job_ref: str, offset: Optional[int] = None, max_bytes: Optional[int] = None
    ) -> logpages.LogPage:
        """The job's output from byte ``offset`` (default: the last 64 KiB), a page of it; a
        character cut at either end is left for the next read. Raises
        LookupError for an unknown job, ValueError for a negative offset or a log that cannot
        be read."""
        with self.table.lock:
            found = self.table.find(job_ref)
            rec = found.rec if isinstance(found, Job) else found
        path = Path(str(rec.log_path or self.table.paths.jobs_dir / rec.id / "log"))
        try:
            return logpages.read_page(path, offset, max_bytes, self._log_cap(rec))
        except OSError as e:
            raise Refused(
                f"cannot read the log of job {rec.id}: {e.strerror or one_line(e)}"
            ) from None

    def _log_cap(self, rec: JobRecord) -> int:
        return logpages.log_cap(rec, int(self.table.setting("jobs.log_max_mb", LOG_MAX_MB)) << 20)

    def _running_logs(self) -> List[Tuple[str, int]]:
        """(log path, cap) of every job with a process, for the log keeper's thread."""
        with self.table.lock:
            return [
                (str(j.rec.log_path), self._log_cap(j.rec))
                for j in self.table.jobs.values()
                if j.state in vocab.LIVE and j.rec.log_path
            ]
