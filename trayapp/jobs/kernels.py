"""Jupyter kernels as jobs: adopting a kernel that Jupyter started, and the kernel's ladder.

A kernel started from Headroom's kernel spec asks the engine, over the control channel (the
user's own: its key is a 0600 file under the user's runtime folder), to ``kernel_adopt`` it.
The engine believes no word of the request it can check itself: the asking process must be the
one it names (the socket's peer credentials, on Linux), be this user's, alive, and run the
runner in kernel mode. It then makes a job of kind "kernel" (a folder, a key, a channel) and
answers with the channel's address and key; the runner connects there as a script's does.
The same process asking again gets the same job; at most ``MAX_KERNELS`` kernels live at once.

The ladder of a kernel (it holds the user's variables): a pause waits for the next batch end
during a ``fit()`` and suspends the tree at once otherwise; a park is "interrupt the fit" (at a
batch end a checkpoint, then ``KeyboardInterrupt`` in the cell, and the kernel runs on); a stop
ends the kernel. The job ends when the kernel's process exits.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import struct
from typing import Any, List, Optional, Tuple

import psutil

from trayapp import vocab
from trayapp.channel import Peer
from trayapp.errors import Refused
from trayapp.jobs import trees
from trayapp.jobs.braking import Brakes
from trayapp.jobs.job import BY_USER, SUSPENDED, Event, Job
from trayapp.jobs.options import JobSpec, SpecError
from trayapp.jobs.record import KERNEL, JobRecord
from trayapp.jobs.runner_link import RunnerLink
from trayapp.jobs.starting import Launcher, remove_folder
from trayapp.jobs.table import JobTable
from trayapp.jobs.transitions import On
from trayapp.jsonvalue import JSONObject, JSONValue
from trayapp.request_args import Args, Handlers
from trayapp.runner import protocol as rp
from trayapp.text import one_line
from trayapp.vocab import EventKind as E
from trayapp.vocab import JobState as S

log = logging.getLogger("headroom.jobs")

MAX_KERNELS = 64  # live kernel jobs at once: a flood of requests cannot grow the engine more
MAX_NAME = 200
KERNEL_MARK = "--kernel"  # in the command line of a kernel run by the runner
INTERRUPT_SETTLE_SECONDS = 45.0


def peer_credentials(peer: Peer) -> Optional[Tuple[int, int]]:
    """(pid, uid) of the process at the other end of a peer's Unix socket, or None where the
    system does not say (not Linux, a named pipe)."""
    option = getattr(socket, "SO_PEERCRED", None)
    conn = getattr(peer, "conn", None)
    if option is None or conn is None:
        return None
    try:
        sock = socket.socket(fileno=os.dup(conn.fileno()))
    except (OSError, ValueError, AttributeError):
        return None
    try:
        data = sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    except OSError:
        return None
    finally:
        sock.close()
    pid, uid, _ = struct.unpack("3i", data)
    return pid, uid


def kernel_process(pid: Any, peer: Optional[Tuple[int, int]]) -> psutil.Process:
    """The process a ``kernel_adopt`` request names, once it proved to be the asking one, this
    user's, alive and a kernel under the runner. Raises ValueError saying what is wrong."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or pid >= 1 << 31:
        raise Refused("kernel_adopt: pid must be a process id")
    if peer is not None:
        if peer[1] != os.getuid():
            raise Refused("kernel_adopt: the asking process is another user's")
        if peer[0] != pid:
            raise Refused(f"kernel_adopt: process {pid} is not the one asking")
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            raise psutil.NoSuchProcess(pid)
        if hasattr(os, "getuid") and proc.uids().real != os.getuid():
            raise Refused(f"kernel_adopt: process {pid} is another user's")
        cmdline = proc.cmdline()
    except psutil.AccessDenied:
        raise Refused(f"kernel_adopt: process {pid} cannot be watched") from None
    except psutil.Error:
        raise Refused(f"kernel_adopt: no process {pid}") from None
    if KERNEL_MARK not in cmdline:
        raise Refused(f"kernel_adopt: process {pid} is not a Headroom kernel")
    return proc


def kernel_tree(proc: psutil.Process) -> List[int]:
    """The pids of a kernel's process tree, its root first (what is gone is left out)."""
    pids = [proc.pid]
    try:
        pids += [c.pid for c in proc.children(recursive=True)]
    except psutil.Error:
        pass
    return pids


def kernel_spec(data: Any) -> JobSpec:
    """The engine-side spec of a kernel from its ``HEADROOM_KERNEL`` object (``{"v": 1,
    "name", "spec": {...}}``): what a job spec takes of it (budgets, checkpoint folder,
    preset ...); a field it does not take, or a spec it refuses, is left out (logged)."""
    raw = data.get("spec") if isinstance(data, dict) else None
    if not isinstance(raw, dict):
        return JobSpec(script="")
    known = set(JobSpec.__dataclass_fields__) - {"script", "args", "python", "cwd", "env"}
    fields = {k: v for k, v in raw.items() if k in known}
    try:
        return JobSpec.from_json({**fields, "script": ""})
    except SpecError as e:
        log.warning("a kernel's spec was not taken (%s); it runs with the defaults", e)
        return JobSpec(script="")


def kernel_name(args: Args) -> str:
    name: Optional[JSONValue] = args.opt_text("name")
    if not isinstance(name, str) or not name.strip():
        kernel = args.opt_object("kernel")
        name = kernel.get("name") if kernel is not None else None
    return one_line(name, MAX_NAME) if isinstance(name, str) and name.strip() else KERNEL


class KernelJobs:
    """The job manager's kernels, among the jobs of ``table``: adoption (each with its channel,
    ``link``, its folder and record as a job's, ``launcher``, its cgroups, ``brakes``), and
    the kernel's ladder, which the controller asks of it."""

    def __init__(
        self, table: JobTable, link: RunnerLink, launcher: Launcher, brakes: Brakes
    ) -> None:
        self.table = table
        self.link = link
        self.launcher = launcher
        self.brakes = brakes

    def kernel_handlers(self) -> Handlers:
        return {"kernel_adopt": self.adopt_kernel}

    def adopt_kernel(self, peer: Peer, args: Args) -> JSONObject:
        """Make the asking kernel a job (or find the one it is already); returns ``{"job",
        "address", "key" (hex)}``. Raises ValueError for a request it does not take."""
        if self.table.closed:
            raise Refused("the engine is shutting down")
        proc = kernel_process(args.opt_int("pid"), peer_credentials(peer))
        try:
            create_time = proc.create_time()
        except psutil.Error:
            raise Refused("kernel_adopt: the process is gone") from None
        with self.table.lock:
            job = self._kernel_job(proc.pid, create_time)
            if job is None:
                live = sum(1 for j in self.table.jobs.values() if j.rec.is_kernel)
                if live >= MAX_KERNELS:
                    raise Refused(
                        f"kernel_adopt: {live} kernels are watched already, the "
                        "most the engine takes"
                    )
                job = self._new_kernel(proc, create_time, args)
                self.table.jobs[job.id] = job
                self.table.save(job)
                fresh = True
            else:
                fresh = False
            answer: JSONObject = {
                "job": job.id,
                "address": self.table.paths.job_address(job.id),
                "key": job.key.hex(),
            }
            rec = job.rec
        if fresh:
            self.table.emit(
                E.JOB_ADOPTED,
                f"kernel {rec.id} ({rec.name}) is a job now (pid {rec.pid}): the guard watches it",
                job_id=rec.id,
                data={"pid": rec.pid, "kind": KERNEL},
            )
        return answer

    def _kernel_job(self, pid: int, create_time: float) -> Optional[Job]:
        for job in self.table.jobs.values():
            rec = job.rec
            if (
                rec.is_kernel
                and rec.pid == pid
                and rec.state in vocab.LIVE
                and rec.create_time is not None
                and abs(rec.create_time - create_time) < 0.01
            ):
                if job.server is None:
                    self.link.open_channel(job)
                return job
        return None

    def _new_kernel(self, proc: psutil.Process, create_time: float, args: Args) -> Job:
        """The kernel's folder, key, spec and channel (under the lock)."""
        spec = kernel_spec(args.opt_object("kernel"))
        try:
            applied = self.launcher.with_preset(spec)
        except SpecError as e:
            log.warning("a kernel's preset was not applied (%s)", one_line(e))
            applied = spec
        spec_data = {k: v for k, v in spec.to_json().items() if k not in ("script", "args")}
        try:
            job_id, folder, key = self.launcher.new_folder(spec_data)
        except OSError as e:
            raise Refused(f"kernel_adopt: cannot keep the job: {e.strerror or e}") from None
        connection = args.opt_text("connection_file")
        rec = dataclasses.replace(
            self.launcher.new_record(job_id, applied, spec_data, folder, []),
            name=kernel_name(args),
            kind=KERNEL,
            pid=proc.pid,
            pids=(proc.pid,),
            create_time=create_time,
            log_path=None,  # a kernel's output is in its notebook
            script=one_line(connection, 1000) if isinstance(connection, str) else "",
        )
        job = Job(rec, key)
        job.process = proc
        job.known = {proc.pid: proc}
        try:
            self.link.open_channel(job)
        except ValueError:
            remove_folder(folder)
            raise
        self.brakes.cgroup_place_kernel(job, kernel_tree(proc))
        return job

    # -- the kernel's ladder (the controller asks) ---------------------------------------------

    def pause_deadline(self, job_ref: str, deadline: Optional[float]) -> Optional[float]:
        """The pause deadline for the job: as asked for a script; 0 for a kernel between fits
        (it is suspended at once: nothing to wait for)."""
        with self.table.lock:
            job = self.table.find(job_ref)
            idle = isinstance(job, Job) and job.rec.is_kernel and not job.rec.kernel_in_fit
        return 0 if idle else deadline

    def is_kernel(self, job_ref: str) -> bool:
        """Whether the job is a live (or parked) kernel: it is not parked, its fit is
        interrupted instead (``interrupt``)."""
        with self.table.lock:
            job = self.table.find(job_ref)
            return isinstance(job, Job) and job.rec.is_kernel

    def check_resume(self, job_ref: str) -> None:
        """Refuse (ValueError) to resume a kernel that has ended: Jupyter starts kernels."""
        with self.table.lock:
            found = self.table.find(job_ref)
        rec = found.rec if isinstance(found, Job) else found
        if rec.is_kernel and rec.state in vocab.ENDED:
            raise Refused(
                f"kernel {rec.id} has ended; Jupyter starts kernels (restart it "
                "there and run the fit() again: it goes on from its checkpoint)"
            )

    def interrupt(self, job_ref: str, *, by: str = BY_USER, reason: str = "") -> JobRecord:
        """Interrupt a kernel's fit: the runner saves a checkpoint at the next batch end (with a
        checkpoint folder) and raises KeyboardInterrupt in the cell; the kernel lives on
        (state "parking" until the runner says so, then "running"). A suspended kernel is
        continued first. Raises ValueError when no fit runs or the kernel is not connected."""
        with self.table.lock:
            job = self.table.live(job_ref, "interrupt")
            rec = job.rec
            if job.state == S.PARKING:
                return rec
            if not rec.kernel_in_fit or job.peer is None:
                raise Refused(
                    f"kernel {job.id} runs no fit() that Headroom follows: there "
                    "is nothing to interrupt (pause or stop it instead)"
                )
            if rec.pause_mode == SUSPENDED:
                trees.resume(job)
            if not self.table.send(job, rp.PARK):
                raise Refused(f"kernel {job.id} did not take the request (its channel closed)")
            job.park_note = (by, reason)
            self.table.move(job, On.PARK_ASKED, by=by, reason=reason)
            job.pause_deadline = None
            self.table.save(job)
            return job.rec

    def fit_ended(self, job: Job, events: List[Event]) -> None:
        """The runner of a kernel says no fit runs: an interrupt under way has happened (under
        the lock; its event goes to ``events``). The runner link tells it."""
        if job.state != S.PARKING:
            return
        by, why = job.park_note
        self.table.move(job, On.INTERRUPTED)
        self.table.save(job)
        point = job.rec.checkpoint.path if job.rec.checkpoint is not None else None
        where = (
            f"; its checkpoint is in {point}"
            if point
            else " (no checkpoint folder: nothing was saved)"
        )
        who = "you" if by == BY_USER else f"the {by}"
        events.append(
            (
                E.JOB_INTERRUPTED,
                "warn",
                f"kernel {job.id} ({job.rec.name}): its fit was interrupted by {who}"
                f"{': ' + why if why else ''}{where}. The kernel and its variables are "
                "kept; TensorFlow keeps the GPU memory it holds until the kernel "
                "restarts. Run the same fit() again to go on from the checkpoint.",
                job.id,
                {"by": by, "reason": why, "checkpoint": point},
            )
        )


def stops_itself(job: Job) -> bool:
    """The runner is the stop's first step: it hooked ``fit`` (its stop saves first), or the
    job is a connected kernel, which ends itself on a stop, Keras or not: at once between
    fits, at the next batch end in one. (Signals are slow on a kernel: ipykernel takes SIGINT
    as an interrupt of the cell, so the stop would wait for SIGTERM.)"""
    if job.rec.is_kernel and job.peer is not None:
        return True
    return job.rec.hooked
