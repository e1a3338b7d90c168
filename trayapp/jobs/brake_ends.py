"""How a run ends that the kernel brake ended (held at its cgroup's limit, ``STALL``) or the
kernel's OOM killer did (``OOM_KILL``): relaunched at half its micro-batch where it can train
so, else stopped, failed or held; and the words for each. Pure: records in, words out (the
brake itself is ``trayapp.jobs.braking``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from trayapp.formats import format_bytes
from trayapp.jobs.record import JobRecord, smallest_micro_batch
from trayapp.vocab import EventKind as E
from trayapp.vocab import JobState as S

STALL = "stall"
OOM_KILL = "oom_kill"


@dataclass(frozen=True)
class BrakeEnd:
    """How a run that the brake ended (or the OOM killer did) ends: the state, end reason and
    event, and the accumulation to relaunch at (None: not relaunched)."""

    state: str
    reason: str
    kind: str
    level: str
    message: str
    accumulation: Optional[int] = None
    from_checkpoint: bool = True
    cause: str = ""  # what happened, in words ("stalled at its cgroup's limit of 1.1 GiB")


def brake_accumulation(rec: JobRecord) -> Optional[int]:
    """The accumulation of a relaunch at half the micro-batch (the same training), or None
    where the job cannot train smaller (``why_not_smaller`` says why). Unlike the guard's
    "relaunch smaller" it needs no checkpoint folder: without one, the relaunch starts over."""
    if not rec.hooked or not rec.shrinkable or not rec.batch or rec.is_kernel:
        return None
    k = (rec.accumulation or 1) * 2
    if rec.batch % k or rec.batch // k < smallest_micro_batch(rec):
        return None
    return k


def why_not_smaller(rec: JobRecord) -> str:
    """Why ``brake_accumulation`` is None for ``rec``, in words."""
    if rec.is_kernel:
        return "a Jupyter kernel is not relaunched"
    if not rec.hooked:
        return "it does not report to Headroom (no Keras fit hooked), so it cannot train smaller"
    if not rec.shrinkable or not rec.batch:
        return (
            "its fit cannot train at a smaller micro-batch (Keras 2, input it cannot "
            "re-batch, or --on-oom stop)"
        )
    micro = rec.batch // (rec.accumulation or 1)
    floor = smallest_micro_batch(rec)
    if micro // 2 < floor:
        return f"half its micro-batch of {micro} would be below --min-batch {floor}"
    return f"its batch of {rec.batch} does not split into micro-batches of {micro // 2}"


def held_note(rec: JobRecord, limit: int, where: str) -> str:
    """The note for a job the kernel holds at its cgroup's ``limit`` (``where``: what the
    limit is) that is not relaunched: a kernel's state lives in its process, so it is held,
    never killed; the note says how to go on."""
    if rec.is_kernel:
        return (
            f"kernel {rec.id} ({rec.name}) is held by the kernel at its cgroup's limit of "
            f"{format_bytes(limit)} ({where}): its variables live in the process, so it is "
            "not relaunched, and the OOM killer does not end it. To go on, interrupt the "
            f"cell (it takes effect once the kernel runs again), or resume it by hand "
            f"('headroom resume {rec.id}'), which raises its limit by a tenth of its "
            "budget; it also goes on by itself when its limit rises"
        )
    return (
        f"job {rec.id} ({rec.name}) is held by the kernel at its cgroup's limit of "
        f"{format_bytes(limit)} ({where}): {why_not_smaller(rec)}; it goes on when its "
        "limit rises"
    )


def progress_lost(rec: JobRecord) -> str:
    """What a start from the beginning costs, in words."""
    done = []
    if rec.epoch and rec.epochs:
        done.append(f"epoch {rec.epoch} of {rec.epochs}")
    if rec.step is not None and rec.steps:
        done.append(f"step {rec.step} of {rec.steps}")
    where = f" (it was at {', '.join(done)})" if done else ""
    return f"no checkpoint folder: the training so far is lost{where}"


def brake_end(rec: JobRecord, cause: str, size: int) -> BrakeEnd:
    """How a run ends that the brake ended (``cause`` STALL: held at its cgroup's limit of
    ``size`` bytes) or the kernel's OOM killer did (OOM_KILL: at ``size`` bytes)."""
    head = f"job {rec.id} ({rec.name})"
    shown = format_bytes(size)
    what = (
        f"stalled at its cgroup's limit of {shown}"
        if cause == STALL
        else f"the kernel's OOM killer ended it at {shown}"
    )
    k = brake_accumulation(rec)
    if k is not None and rec.batch:
        micro = rec.batch // k
        ck = bool(rec.checkpoint_dir)
        how = "from its checkpoint" if ck else "from the beginning"
        said = f"{what}; relaunched {how} at micro-batches of {micro} x {k} (the same training)"
        if not ck:
            said += f"; {progress_lost(rec)}"
        return BrakeEnd(
            S.PARKED,
            f"ended by the engine: {what}",
            E.JOB_BRAKED,
            "warn",
            f"{head} {said}",
            k,
            ck,
            what,
        )
    why = why_not_smaller(rec)
    if cause == STALL:
        reason = f"stopped by the engine: {what}; {why}"
        message = f"{head} {reason}"
        if rec.checkpoint_dir:
            message += f"; continue it from its checkpoint with 'headroom resume {rec.id}'"
        return BrakeEnd(S.STOPPED, reason, E.JOB_STOPPED, "warn", message, cause=what)
    reason = f"{what}; not relaunched: {why}"
    return BrakeEnd(S.FAILED, reason, E.JOB_FAILED, "error", f"{head} failed: {reason}", cause=what)
