"""The kernel brake, the job manager's side: each job in cgroups of its own (``cgroups``), its
memory limit following what it may have, and a job the limit stalls handled, not left stalled.

How a job gets in: right after its process starts (``place``), before the runner has read the
job's options, let alone run the script, its pid is written to the job's ``cgroup.procs`` (v1),
or the user's systemd manager is asked for a transient scope holding it (v2, ``scopes``);
what it forks from then on is born inside. (A ``preexec_fn`` would run in the forked child of
a threaded engine, where a lock another thread held at the fork is never released.)

The limit (``cgroups.brake_limit``) is written on every tick of the engine: the smaller of
the job's RAM budget and its use + the machine's available memory - the park reserve (the
setting ``guard.park_available``; ``guard.stop_available`` for a job asked to park or stop,
which must reach a batch end to save). The kernel holds a job at it: with the cgroup's OOM
killer off (v1), a task that needs more waits in the kernel (``under_oom``) instead of being
killed; on v2 the limit is ``memory.high``, where a task stalls in reclaim (``memory.max`` a
margin above it is the last line), taken for held when its ``high`` events rise or its
scope's pressure says it stalls.

A job that waits there for ``STALL_SECONDS`` cannot reach a batch end, so it cannot park. One
that can train at half its micro-batch is ended and relaunched so: from its checkpoint where
it has a checkpoint folder (the same training), else from the beginning, saying what that
cost. One at its ``--min-batch`` already, held at its own budget, is stopped (and says so).
One that cannot train smaller at all is left held, a pause the kernel makes (the guard pauses
it as without the brake), lifted when its limit rises. A job that the kernel's OOM killer
ended (SIGKILL, and its cgroup's ``oom_kill`` counter risen) is relaunched the same way.

Every cgroup failure is one log line, and the job goes on guarded by the guard alone.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from trayapp.config import Threshold
from trayapp.formats import format_bytes
from trayapp.jobs import cgroups, cgroups_v2, scopes, trees
from trayapp.jobs.brake_ends import (
    OOM_KILL,
    STALL,
    BrakeEnd,
    brake_accumulation,
    brake_end,
    held_note,
)
from trayapp.jobs.cgroups import CgroupError, Offer
from trayapp.jobs.cgroups_v1 import JobCgroup
from trayapp.jobs.job import SUSPENDED, Event, Job
from trayapp.jobs.scopes import ScopeCgroup
from trayapp.jobs.table import JobTable
from trayapp.jsonvalue import JSONObject
from trayapp.vocab import EventKind as E
from trayapp.vocab import JobState as S

log = logging.getLogger("headroom.jobs")

# How long a job waits at its limit before it is taken for stalled: a tick or two, so that a
# limit raised as memory comes back lets it go on first.
STALL_SECONDS = 0.5
PARK_RESERVE_DEFAULT = "5%"
STOP_RESERVE_DEFAULT = "2%"
WARN_DEFAULT = "15%"  # guard.warn_available's


@dataclass
class BrakeState:
    """What the brake keeps of one run of a job."""

    oom_kills: int = 0  # its cgroup's oom_kill counter at launch
    stalled_since: Optional[float] = None  # monotonic: since when it waits at its limit
    ended: Optional[Tuple[str, int]] = None  # (STALL, its limit): Headroom ended it so
    budget_said: bool = False  # "its budget is below what it uses" said once
    held_said: bool = False  # "held by the kernel" said once a stall
    refused_said: bool = False  # a limit the kernel refused, said once
    grace_bytes: int = 0  # the budget a resume by hand raised it to (as the guard's grace)


class Brakes:
    """The job manager's kernel brake (see the module docstring), on the jobs of ``table``.
    ``cgroup_root`` and ``proc_cgroup`` point it at another cgroupfs (tests)."""

    cgroup_root = cgroups.ROOT
    proc_cgroup = "/proc/self/cgroup"

    def __init__(self, table: JobTable) -> None:
        self.table = table
        self._offer: Optional[Tuple[bool, Offer]] = None

    def cgroup_offer(self) -> Offer:
        """What this machine offers the jobs (found once; again when the setting
        ``guard.kernel_brake`` changes)."""
        enabled = bool(self.table.setting("guard.kernel_brake", True))
        found = self._offer
        if found is None or found[0] != enabled:
            offer = cgroups.detect(self.cgroup_root, self.proc_cgroup, enabled=enabled)
            log.info("the jobs' protection: %s", offer.words)
            if found is None and offer.kind == cgroups.V2:
                scopes.reset_failed()  # scopes of jobs OOM-killed while no engine watched
            if found is None and offer.brakes:
                gone = cgroups.sweep(offer)
                if gone:
                    log.info("removed %d empty job cgroups an earlier engine left", len(gone))
            self._offer = found = (enabled, offer)
        return found[1]

    def protection(self) -> dict:
        """The protection new jobs get here, for the status (``Offer.to_json``)."""
        return self.cgroup_offer().to_json()

    # -- a job's cgroups ----------------------------------------------------------------------

    def cgroup_place(self, job: Job, pid: int) -> None:
        """Put the job's new process ``pid`` in cgroups of its own, its first limit written
        before it is moved in. Where that fails, one log line: the guard alone guards it."""
        job.cgroup, job.brake = None, BrakeState()
        offer = self.cgroup_offer()
        if not offer.brakes or job.rec.is_kernel:
            job.change(protection=offer.words, cgroup_memory=None)
            return
        group: Optional[JobCgroup] = None
        try:
            if offer.kind == cgroups.V2:
                # The manager makes the scope with the job in it; its limit is written at once.
                scope = ScopeCgroup.start(offer, job.id, pid)
                first = scope.read()
                limit = self._limit_for(job, first)
                if limit is not None:
                    scope.set_limit(limit)
                job.brake.oom_kills = first.oom_kill
                job.cgroup = scope
                job.change(protection=offer.words, cgroup_memory=None)
                return
            group = JobCgroup.make(offer, job.id)
            first = group.read()
            limit = self._limit_for(job, first)
            if limit is not None:
                group.set_limit(limit)
            group.add(pid)
            job.brake.oom_kills = first.oom_kill
        except CgroupError as e:
            log.warning("job %s: %s; it is guarded without the kernel brake", job.id, e)
            job.change(protection=f"{cgroups.WORDS[cgroups.NONE]} ({e})", cgroup_memory=None)
            if group is not None:
                self._cgroup_remove(job.id, group)
            return
        job.cgroup = group
        job.change(protection=offer.words, cgroup_memory=None)

    def cgroup_place_kernel(self, job: Job, pids: List[int]) -> None:
        """A Jupyter kernel, adopted: its running process tree (``pids``, its root first) is
        moved into cgroups of its own, as a script job's is at its start. The memory it holds
        already stays charged where it was (v1 is asked to move it where it can, v2 never
        does): its limit counts that part (``cgroups.kernel_limit``). Where that fails, one
        log line: the guard alone guards it, and its protection says why."""
        job.cgroup, job.brake = None, BrakeState()
        offer = self.cgroup_offer()
        if not offer.brakes or not pids:
            job.change(protection=offer.words, cgroup_memory=None)
            return
        group: Any = None  # a JobCgroup (v1) or a ScopeCgroup (v2)
        try:
            made: Any
            if offer.kind == cgroups.V2:
                made = group = ScopeCgroup.start(offer, job.id, pids[0])
            else:
                made = group = JobCgroup.make(offer, job.id)
                made.move_charges()  # v1 only: what it holds comes along where it can
            first = made.read()
            limit = self._limit_for(job, first, self._elsewhere(job, first))
            if limit is not None:
                made.set_limit(limit)
            if offer.kind != cgroups.V2:
                made.add(pids[0])
            for pid in pids[1:]:
                try:
                    made.add(pid)
                except CgroupError:
                    pass  # it ended meanwhile (or cannot move): counted as held elsewhere
            job.brake.oom_kills = first.oom_kill
        except CgroupError as e:
            log.warning("kernel %s: %s; it is guarded without the kernel brake", job.id, e)
            job.change(protection=f"{cgroups.WORDS[cgroups.NONE]} ({e})", cgroup_memory=None)
            if group is not None:
                self._cgroup_remove(job.id, group)
            return
        job.cgroup = group
        job.change(protection=offer.words, cgroup_memory=None)

    def _elsewhere(self, job: Job, r: cgroups.Reading) -> int:
        """What a kernel's processes hold outside its cgroup (``cgroups.charged_elsewhere``,
        from its tree's RSS now); 0 for a script job, whose tree was born inside."""
        if not job.rec.is_kernel:
            return 0
        total, seen = 0, False
        pids = job.rec.pids or ((job.rec.pid,) if job.rec.pid else ())
        for pid in pids:
            proc = job.known.get(pid)
            if proc is None:
                continue
            try:
                total += int(proc.memory_info().rss)
                seen = True
            except Exception:  # psutil.Error: it is gone
                continue
        return cgroups.charged_elsewhere(r.usage, total if seen else None)

    def cgroup_adopt(self, job: Job) -> None:
        """An earlier engine's job, taken back: its cgroups too, where its process still is
        in them; else the guard alone."""
        job.cgroup, job.brake = None, BrakeState()
        offer = self.cgroup_offer()
        pid = job.rec.pid
        kind = ScopeCgroup if offer.kind == cgroups.V2 else JobCgroup
        group = kind.of_process(offer, pid, job.id) if pid else None
        if group is None:
            job.change(
                protection=offer.words
                if not offer.brakes
                else f"{cgroups.WORDS[cgroups.NONE]} (it runs in no cgroup of its own)"
            )
            return
        try:
            job.brake.oom_kills = group.read().oom_kill
        except CgroupError as e:
            log.warning("job %s: %s; it is guarded without the kernel brake", job.id, e)
            return
        job.cgroup = group
        job.change(protection=offer.words)

    def _cgroup_lost(self, job: Job, error: CgroupError) -> None:
        """The job's cgroup failed under it: one line, and the guard alone from now on."""
        log.warning("job %s: %s; the kernel brake is off for it, the guard goes on", job.id, error)
        group, job.cgroup = job.cgroup, None
        job.change(protection=f"{cgroups.WORDS[cgroups.NONE]} ({error})", cgroup_memory=None)
        if group is not None:
            try:
                group.remove()  # what is left of it (its freezer): thawed, emptied, gone
            except CgroupError:
                pass

    def cgroup_release(self, job: Job) -> None:
        """The run has ended: its cgroups go (what is left in them moves to the parents)."""
        group, job.cgroup = job.cgroup, None
        if group is not None:
            self._cgroup_remove(job.id, group)

    def _cgroup_remove(self, job_id: str, group: JobCgroup) -> None:
        try:
            group.remove()
        except CgroupError as e:
            log.warning("job %s: its cgroup was not removed: %s", job_id, e)

    @staticmethod
    def _cgroup_counted(job: Job, counted: int, shown: JSONObject) -> None:
        """The job's memory as its cgroup counts it; none counted yet (its process just moved
        in, its pages charged where they were made) leaves the reading of its processes."""
        if counted > 0:
            job.change(rss_bytes=counted, memory_method="cgroup", cgroup_memory=shown)
        else:
            job.change(cgroup_memory=shown)

    def cgroup_bytes(self, job: Job) -> Optional[int]:
        """The job's memory now from its cgroup (``Reading.held``), None without one."""
        group = job.cgroup
        if group is None:
            return None
        try:
            return int(group.read().held)
        except CgroupError:
            return None  # the tick says it

    def exact_readings(self, job: Job) -> bool:
        """Whether the job's tree may be read exactly now (each member's ``smaps_rollup``).
        Not when its cgroup counts its memory (the count the job is shown and guarded by), nor
        while the memory available is below the warning threshold: a read holds the process's
        pages until it is done, and when the kernel's OOM killer has just ended that process,
        the kernel, finding its pages still charged, ends another one too."""
        if job.rec.memory_method == "cgroup":
            return False
        snap = self.table.snapshot
        if snap is None:
            return True
        mem = snap.memory
        reserve = self._threshold("guard.warn_available", WARN_DEFAULT)
        return mem.available_bytes >= reserve.bytes_of(mem.total_bytes)

    def _threshold(self, name: str, default: str) -> Threshold:
        """Setting ``name``, a threshold; ``default`` when it cannot be read."""
        try:
            return Threshold.parse(self.table.setting(name, default))
        except ValueError:
            return Threshold.parse(default)

    # -- the brake, on every tick -------------------------------------------------------------

    def _limit_for(self, job: Job, r: cgroups.Reading, outside: int = 0) -> Optional[int]:
        """The limit for the job now (``cgroups.brake_limit``; with ``outside`` bytes its
        processes hold charged elsewhere, ``cgroups.kernel_limit``), None before the engine's
        first reading of memory."""
        snap = self.table.snapshot
        if snap is None:
            return None
        mem = snap.memory
        # A job asked to park or stop must reach a batch end to save: it may use memory down
        # to the last resort's threshold, as it could without the brake.
        name, default = (
            ("guard.stop_available", STOP_RESERVE_DEFAULT)
            if job.state in (S.PARKING, S.STOPPING)
            else ("guard.park_available", PARK_RESERVE_DEFAULT)
        )
        reserve = self._threshold(name, default)
        budget = self._brake_budget(job)
        st = job.brake
        # (A few MiB above a v2 memory.high at its budget is being held there, not over it.)
        held_at = (
            r.limit is not None
            and budget is not None
            and budget >= r.limit
            and r.usage <= r.limit + cgroups_v2.high_slack(r.limit)
        )
        if (
            budget is not None
            and budget < r.usage + outside
            and st is not None
            and not st.budget_said
            and not held_at
        ):
            st.budget_said = True
            log.warning(
                "job %s: its RAM budget of %s is below what it already uses (%s): its "
                "limit stays a margin above its use, and the guard handles it",
                job.id,
                format_bytes(budget),
                format_bytes(r.usage + outside),
            )
        return cgroups.kernel_limit(
            r.usage,
            outside,
            budget,
            mem.available_bytes,
            reserve.bytes_of(mem.total_bytes),
            r.limit,
        )

    def brake(self, job: Job, t: float, events: List[Event]) -> None:
        """One tick of the brake for a live job: read its cgroup, write its limit, take its
        memory from it, and handle a stall (``_stalled``)."""
        group = job.cgroup
        if group is None or job.exit_seen:
            return
        if not self.cgroup_offer().brakes:  # turned off meanwhile: the job leaves its cgroup
            self._cgroup_lost(job, CgroupError("the kernel brake was turned off"))
            return
        st = job.brake if job.brake is not None else BrakeState()
        job.brake = st
        try:
            r = group.read()
            outside = self._elsewhere(job, r)
            shown = r.to_json()
            if job.rec.is_kernel:
                shown["charged_elsewhere_bytes"] = outside
            if str(self.table.setting("guard.mode", "act")) != "act":
                # The guard off or in its dry run: nothing holds the job; its memory still
                # read exactly from its cgroup.
                if r.limit is not None:
                    group.set_limit(-1)  # "no limit"
                self._cgroup_counted(job, r.held + outside, shown)
                return
            raised = False
            limit = self._limit_for(job, r, outside)
            if limit is not None and cgroups.worth_writing(limit, r.limit):
                raised = self._write_limit(job, group, limit, r)
        except CgroupError as e:
            self._cgroup_lost(job, e)
            return
        self._cgroup_counted(job, r.held + outside, shown)
        if job.rec.pause_mode == SUSPENDED and group.freezer is not None:
            self._kill_through_freezer(job, group)
        if not r.under_oom or job.state == S.STOPPING or st.ended is not None:
            st.stalled_since = None
            st.held_said = False
            return
        if raised or st.stalled_since is None:
            st.stalled_since = t  # a limit raised lets it go on: it is not stalled yet
            return
        if t - st.stalled_since >= STALL_SECONDS:
            self._stalled(job, group, r, events)

    def _kill_through_freezer(self, job: Job, group: JobCgroup) -> None:
        """A SIGKILL sent to a process of a frozen job (by the user, another program) waits
        until the freezer lets go: the job is paused by SIGSTOP instead (``hand_over``), so
        the kill takes effect, as it would on a stopped process, and the rest stays paused."""
        try:
            if group.freezer_state() != "THAWED" and cgroups.kill_pending(group.pids()):
                log.warning(
                    "job %s: a SIGKILL waits for it while it is frozen: paused by "
                    "signal instead, so that it takes effect",
                    job.id,
                )
                group.hand_over()
        except CgroupError:
            pass  # the next read says it

    def cgroup_hand_over(self, job: Job) -> None:
        """The engine goes away: a frozen job is left stopped by signal instead (paused still,
        and a SIGKILL from anyone ends it); the next engine takes its cgroups back."""
        group = job.cgroup
        if group is not None and group.freezer is not None:
            try:
                group.hand_over()
            except CgroupError as e:
                log.warning("job %s: %s", job.id, e)

    def _write_limit(self, job: Job, group: JobCgroup, limit: int, r: cgroups.Reading) -> bool:
        """Write the limit; True when it went up. A limit the kernel refuses (it cannot take
        back enough at once) is said once and tried again next tick."""
        try:
            group.set_limit(limit)
        except CgroupError as e:
            if "is gone" in str(e):
                raise
            st = job.brake
            if st is not None and not st.refused_said:
                st.refused_said = True
                log.warning("job %s: %s (tried again each tick)", job.id, e)
            return False
        return r.limit is not None and limit > r.limit

    def _stalled(self, job: Job, group: JobCgroup, r: cgroups.Reading, events: List[Event]) -> None:
        """The job waits in the kernel at its limit and cannot reach a batch end. One that
        can train at half its micro-batch is ended, to be relaunched so at once; one at its
        ``--min-batch`` already, held at its own budget, is ended and stopped. One that cannot
        train smaller at all is held by the kernel as a pause is (the guard pauses it at its
        budget as without the brake): said once, and it goes on when the limit rises (memory
        comes back, or a resume by hand gives its budget a tenth more)."""
        st = job.brake
        assert st is not None
        rec = job.rec
        limit = r.limit if r.limit is not None else r.usage
        budget = self._brake_budget(job)
        outside = self._elsewhere(job, r)  # a kernel's memory charged where it was
        at_budget = budget is not None and limit + outside >= budget - cgroups.WRITE_STEP_BYTES
        smaller = brake_accumulation(rec) is not None
        at_floor = rec.hooked and rec.shrinkable and bool(rec.batch) and not rec.is_kernel
        if not smaller and not (at_floor and at_budget):
            if not st.held_said:
                st.held_said = True
                where = (
                    f"its budget of {format_bytes(budget)}"
                    if at_budget and budget
                    else "what the machine can give it"
                )
                if outside:
                    where += f", less the {format_bytes(outside)} it holds outside its cgroup"
                events.append(
                    (
                        E.JOB_NOTE,
                        "warn",
                        held_note(rec, limit, where),
                        rec.id,
                        {"cause": STALL, "limit_bytes": limit},
                    )
                )
            return
        st.ended = (STALL, limit)
        job.pause_deadline = None  # no suspend now: a frozen task would not die of the kill
        log.warning(
            "job %s: stalled at its cgroup's limit of %s (%s); ending it",
            rec.id,
            format_bytes(limit),
            "its budget" if at_budget else "what the machine has",
        )
        try:
            group.kill()
        except CgroupError as e:
            log.warning("job %s: %s", rec.id, e)
        trees.kill_root(job)

    def _brake_budget(self, job: Job) -> Optional[int]:
        """The job's RAM budget as the brake holds it: raised by what a resume by hand gave."""
        budget = job.rec.ram_budget_bytes
        st = job.brake
        if budget is None or st is None:
            return budget
        return max(budget, st.grace_bytes)

    def brake_resumed(self, job: Job, share: float) -> None:
        """A resume by hand of a job at (or near) its budget: its limit gets ``share`` of the
        budget more than it uses now, as the guard's own threshold does, so the resume sticks
        instead of leaving it stalled in the kernel."""
        budget, st, group = job.rec.ram_budget_bytes, job.brake, job.cgroup
        if budget is None or st is None or group is None:
            return
        try:
            used = group.read().usage
        except CgroupError:
            return
        if used >= budget * (1.0 - share):
            st.grace_bytes = max(st.grace_bytes, int(used + share * budget))
            st.stalled_since = None

    def brake_ending_now(self, job: Job) -> bool:
        """The brake is ending this run (to relaunch it smaller): the guard leaves it be."""
        return job.brake is not None and job.brake.ended is not None

    def brake_ending(self, job: Job, code: Optional[int]) -> Optional[BrakeEnd]:
        """How the run ends when the brake ended it, or the kernel's OOM killer did (SIGKILL
        with its cgroup's ``oom_kill`` counter risen); None for any other end."""
        st, group = job.brake, job.cgroup
        if st is None or (job.state == S.STOPPING and st.ended is None):
            return None  # a stop asked for is a stop
        if st.ended is not None:
            return brake_end(job.rec, STALL, st.ended[1])
        if group is None or code != -signal.SIGKILL:  # (no cgroup, no SIGKILL: Windows)
            return None
        try:
            peak = group.oom_killed(st.oom_kills)
        except CgroupError:
            return None
        if peak is None:
            return None
        return brake_end(job.rec, OOM_KILL, peak)
