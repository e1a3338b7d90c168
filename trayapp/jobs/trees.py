"""A job's process tree: listing it, its remnants (processes reparented away), signalling it,
suspending and continuing it, reaping what it leaves (the engine as subreaper), sampling its
memory, and telling whether a saved pid is still the process that was started.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from typing import Any, Dict, List, Optional, Sequence, Set

import psutil

from trayapp.jobs.cgroups import CgroupError
from trayapp.jobs.job import Job
from trayapp.jobs.ladder import Stage
from trayapp.jobs.record import JobRecord
from trayapp.probes.processes import SAME_PROCESS_TOLERANCE_S, TreeMeter, tree_memory
from trayapp.readings import GpuReading

log = logging.getLogger("headroom.jobs")

WINDOWS = sys.platform == "win32"
ORPHAN_CHECK_SECONDS = 1.0  # what ended jobs left is looked at at most this often


def tree(job: Job, with_remnants: bool = False) -> List[psutil.Process]:
    """The root and its descendants now (a fresh look), plus with ``with_remnants`` every
    process seen in the tree earlier that still runs (reparented children)."""
    out: Dict[int, psutil.Process] = {}
    root = job.process
    if root is not None:
        try:
            if root.is_running():
                out[root.pid] = root
                for c in root.children(recursive=True):
                    out[c.pid] = c
                    job.known.setdefault(c.pid, c)
        except psutil.Error:
            pass
    if with_remnants:
        for p in remnants(job):
            out.setdefault(p.pid, p)
    return list(out.values())


def remnants(job: Job) -> List[psutil.Process]:
    """Processes seen in the tree that still run. Zombies handed to the engine (the
    subreaper) are reaped; one whose parent is still in the tree is kept in view, as it
    comes to the engine when that parent is gone."""
    alive = []
    root = job.popen.pid if job.popen is not None else None
    for pid, p in list(job.known.items()):
        try:
            # is_running() compares the create time, so a reused pid does not count.
            if p.is_running():
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
                    continue
                if pid == root:
                    continue  # Popen collects it
                if not reap(p) and p.ppid() in job.known:
                    continue
        except psutil.Error:
            pass
        job.known.pop(pid, None)
    if job.popen is not None and job.popen.poll() is None and job.process is not None:
        if job.process.pid not in {p.pid for p in alive}:
            alive.append(job.process)
    return alive


def suspend(job: Job) -> None:
    """Freeze the job's cgroup where it has a freezer (every process of it at once, those it
    forks meanwhile included); else, or where freezing fails, SIGSTOP to every process of the
    tree."""
    cgroup = job.cgroup
    if cgroup is not None and getattr(job.brake, "ended", None) is None:  # not one being ended
        try:
            if cgroup.freeze():
                return
        except CgroupError as e:
            log.warning("job %s: %s; suspended by SIGSTOP instead", job.id, e)
    procs = tree(job)
    for p in procs:
        try:
            p.suspend()
        except psutil.Error:
            pass
    # A child forked while the root was being stopped is caught by a second look.
    seen = {q.pid for q in procs}
    for p in tree(job):
        if p.pid not in seen:
            try:
                p.suspend()
            except psutil.Error:
                pass


def resume(job: Job) -> None:
    """Thaw the job's cgroup, and SIGCONT to the group and every process of the tree (the
    guard may have stopped the group by signal before the freeze)."""
    cgroup = job.cgroup
    if cgroup is not None:
        try:
            cgroup.thaw()
            for pid in cgroup.pids():  # stopped by signal (an engine handed it over): all
                os.kill(pid, signal.SIGCONT)  # of it, those that left the tree too
        except (CgroupError, OSError) as e:
            log.warning("job %s: %s", job.id, e)
    if not WINDOWS:
        killpg(group(job), signal.SIGCONT)
    for p in tree(job):
        try:
            p.resume()
        except psutil.Error:
            pass


def group(job: Job) -> int:
    """The job's process group to signal (0: none). A job the engine started leads a group of
    its own, whose id no new process gets while any of it lives. An adopted one (a Jupyter
    kernel, a job of an earlier engine) is not the engine's child: its pid may lead no group,
    or be another process's once it has ended and its parent collected it; its group is
    signalled only while the job's own root leads it."""
    pid = job.rec.pid or 0
    if pid <= 1 or WINDOWS:
        return 0
    if job.popen is None:
        try:
            if same_process(pid, job.rec.create_time) is None or os.getpgid(pid) != pid:
                return 0
        except OSError:
            return 0
    return pid


def signal_stage(job: Job, stage: Stage) -> None:
    """Send what stop step ``stage`` sends (asking the runner is not a signal: nothing)."""
    pid = job.rec.pid or 0
    leads = group(job)
    if stage == Stage.INT:
        if WINDOWS:  # pragma: no cover - Windows only
            try:
                os.kill(pid, signal.CTRL_BREAK_EVENT)  # type: ignore[attr-defined]
            except OSError:
                pass
        elif leads:
            killpg(leads, signal.SIGINT)
        elif job.process is not None:  # an adopted root that leads no group of its own
            try:
                job.process.send_signal(signal.SIGINT)  # psutil: not a reused pid
            except psutil.Error:
                pass
    elif stage == Stage.TERM:
        if WINDOWS:  # pragma: no cover - Windows only
            for p in tree(job, with_remnants=True):
                try:
                    p.terminate()
                except psutil.Error:
                    pass
        else:
            killpg(leads, signal.SIGTERM)
            signal_tree(job, signal.SIGTERM)
    elif stage == Stage.KILL:
        if not WINDOWS:
            killpg(leads, signal.SIGKILL)
        for p in tree(job, with_remnants=True):
            try:
                p.kill()
            except psutil.Error:
                pass


def killpg(pid: int, sig: int) -> bool:
    """Signal process group ``pid``; True when the signal went."""
    if pid <= 1:
        return False
    try:
        os.killpg(pid, sig)
        return True
    except OSError:
        return False


def stop_group_now(rec: JobRecord) -> int:
    """SIGSTOP the job's process group at once, before the manager's bookkeeping (its lock, a
    walk of the tree, a write to the store) delays the suspend by milliseconds of growth (the
    guard's pause at its last resort); the pause then suspends the whole tree as usual.
    Returns the group, 0 where none was stopped (Windows, a job that is gone, an adopted root
    that leads no group of its own)."""
    if WINDOWS or not rec.pids:
        return 0
    leader = rec.pids[0]  # jobs start in their own session: the root leads the group
    if rec.create_time is not None and same_process(leader, rec.create_time) is None:
        return 0  # an adopted root (a kernel) that has ended: its pid may be reused
    try:
        if os.getpgid(leader) != leader:
            return 0
    except OSError:
        return 0
    return leader if killpg(leader, signal.SIGSTOP) else 0


def continue_group(leader: int) -> None:
    """Undo ``stop_group_now`` (the pause was refused): SIGCONT to the group."""
    killpg(leader, signal.SIGCONT)


def kill_root(job: Job) -> None:
    """SIGKILL to the job's root process (psutil: never a reused pid)."""
    if job.process is not None:
        try:
            job.process.send_signal(signal.SIGKILL)
        except Exception:  # psutil.Error: it is gone already
            pass


def signal_tree(job: Job, sig: int) -> None:
    for p in tree(job, with_remnants=True):
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass


def end_remnants(job: Job) -> None:
    """SIGTERM (Windows: terminate) to what is left of the tree once its root has ended."""
    for p in remnants(job):
        try:
            if WINDOWS:  # pragma: no cover - Windows only
                p.terminate()
            else:
                p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass


def sample(job: Job, gpus: Sequence[GpuReading], exact: bool = True) -> None:
    """Read the tree's memory into the job's record: each page once (PSS) where the system
    tells, else the summed RSS; VRAM from ``gpus``; the tree's pids. ``exact`` False: no
    ``smaps_rollup`` is read now (``TreeMeter.sample``)."""
    pid = job.rec.pid
    if not pid:
        return
    mem = tree_memory(pid, gpus)
    if mem is None:
        return
    if job.meter is None:
        job.meter = TreeMeter()
    counted = job.meter.sample(mem.tree_pids, exact)
    job.change(
        rss_bytes=counted if counted is not None else mem.tree_rss_bytes,
        memory_method=job.meter.method,
        vram_bytes=mem.vram_bytes,
        pids=tuple(mem.tree_pids),
    )
    for p in mem.tree_pids:
        if p not in job.known:
            try:
                job.known[p] = psutil.Process(p)
            except psutil.Error:
                pass


class Orphans:
    """What the trees of ended jobs left behind, and the process groups of the jobs this
    process started (a job's root leads its own session and group): what in them dies as our
    child, the subreaper's, is reaped even if it was never seen in a sample (a worker forked
    and killed between two samples)."""

    def __init__(self) -> None:
        self.procs: Dict[int, psutil.Process] = {}
        self.groups: Set[int] = set()
        self.checked = 0.0  # monotonic

    def due(self, now: float) -> bool:
        """Whether there is something to look at and a look is due; marks it looked at."""
        if not (self.procs or self.groups) or now - self.checked < ORPHAN_CHECK_SECONDS:
            return False
        self.checked = now
        return True

    def reap(self, live_roots: Set[int]) -> None:
        """Reap what ended jobs left behind once it exits (and is ours to reap); never a live
        job's root (``live_roots``), which its Popen collects."""
        for group in list(self.groups):
            if not reap_group(group, live_roots):
                self.groups.discard(group)
        for pid, p in list(self.procs.items()):
            try:
                if p.is_running():
                    if p.status() != psutil.STATUS_ZOMBIE:
                        continue
                    if not reap(p) and psutil.pid_exists(p.ppid()) and p.ppid() != 1:
                        continue  # its parent still runs: it comes to us when that ends
            except psutil.Error:
                pass
            self.procs.pop(pid, None)


def become_subreaper() -> bool:
    """Linux: make this process the one that orphaned descendants are handed to, so what a
    job's tree leaves behind stays visible (and is reaped here, leaving no zombie) instead of
    going to init. True when it worked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(36, 1, 0, 0, 0)) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def reap_group(group: int, live_roots: Set[int]) -> bool:
    """Reap this process's exited children in process group ``group`` (a job's tree), but not
    a live job's root, which its Popen collects. False once nothing of the group is left."""
    waitid = getattr(os, "waitid", None)
    if WINDOWS or waitid is None:  # pragma: no cover - no zombies, or no waitid (macOS)
        return False
    for _ in range(256):
        try:
            # WNOWAIT: look first, so that a job's root is left to its Popen.
            found = waitid(os.P_PGID, group, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            break  # no child of ours in the group
        if found is None or found.si_pid in live_roots:
            break
        try:
            os.waitpid(found.si_pid, os.WNOHANG)
        except ChildProcessError:
            break
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # it exists (a member we may not signal)
    return True


def reap(proc: psutil.Process) -> bool:
    """Collect a zombie that is our child (an orphan of a job tree), nothing else; True when
    it was ours."""
    if WINDOWS:  # pragma: no cover - no zombies there
        return False
    try:
        if proc.ppid() != os.getpid():
            return False
        os.waitpid(proc.pid, os.WNOHANG)
        return True
    except (psutil.Error, ChildProcessError, OSError):
        return False


def same_process(pid: Any, create_time: Any) -> Optional[psutil.Process]:
    """The process ``pid`` if it is the one that was started (same create time, within
    ``SAME_PROCESS_TOLERANCE_S``) and lives."""
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        proc = psutil.Process(pid)
        if (
            isinstance(create_time, (int, float))
            and abs(proc.create_time() - create_time) > SAME_PROCESS_TOLERANCE_S
        ):
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None
