"""The engine's reading of a job's forecast: what the fit needs on each device at its batch,
against what is free there and the job's budgets, in one sentence, and the micro-batch that fits
(the answer to ``--fit-batch``).

"Free" for a device is what is available now plus what the job itself holds there (the forecast
is of the job's whole memory), capped by the job's budget and, on a GPU, by the limit TensorFlow
was given (``--vram-limit`` / ``--vram-reserve``).

What a forecast says it measured is bounded by the machine (``bounded``): a figure above the
machine's RAM and swap, or above its GPU's total, was not measured and is dropped.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from trayapp.formats import BYTES_SHOWN_MAX, format_bytes
from trayapp.jobs.gpu_choice import selected_gpus
from trayapp.jobs.messages import Forecast
from trayapp.jobs.options import JobSpec, SpecError
from trayapp.jobs.record import JobRecord
from trayapp.jsonvalue import JSONObject
from trayapp.readings import GpuReading, Snapshot
from trayapp.runner import forecast as rf
from trayapp.text import one_line

MiB = 1024 * 1024


@dataclass(frozen=True)
class Room:
    """What a device has for the job: ``free`` bytes, and what bounds it (for the sentence)."""

    device: str  # the runner's name: "ram", "GPU:0"
    label: str  # the user's: "RAM", "GPU 0"
    free: int
    bound: str  # "" (what is free), "its budget", "its limit", "its address-space limit"
    used: int = 0  # what the job holds of it now (a bound's sentence says what is left)

    def said(self) -> str:
        """``"9.0 GiB is free"``; a bound: ``"its budget is 4.0 GiB (3.5 GiB of it left)"`` (what
        the job does not hold of it now)."""
        if not self.bound:
            return f"{format_bytes(self.free)} is free"
        left = format_bytes(max(0, self.free - self.used))
        return f"{self.bound} is {format_bytes(self.free)} ({left} of it left)"


@dataclass(frozen=True)
class Judgement:
    text: str
    fits: bool  # the micro-batch it trains now fits
    accumulation: int  # the micro-batches an update that fit (0: none does)
    need: int  # bytes the tightest device needs at the full batch
    free: int  # ... and has

    def to_json(self) -> JSONObject:
        return {
            "message": self.text,
            "fits": self.fits,
            "accumulation": self.accumulation,
            "need_bytes": self.need,
            "free_bytes": self.free,
        }


def _job_gpus(rec: JobRecord, gpus: Sequence[GpuReading]) -> List[GpuReading]:
    """The job's GPUs in TensorFlow's order ("GPU:0" is the first)."""
    try:
        spec = JobSpec.from_json(dict(rec.spec))
    except (SpecError, TypeError, ValueError):
        return list(gpus)
    return selected_gpus(spec.options, gpus)


def _limit_mb(rec: JobRecord, i: int) -> Optional[int]:
    options = rec.hello.options if rec.hello is not None else None
    limit = options.get("vram_limit_mb") if isinstance(options, Mapping) else None
    if isinstance(limit, list):
        limit = limit[i] if i < len(limit) else None
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None


def rooms(rec: JobRecord, snapshot: Optional[Snapshot]) -> Dict[str, Room]:
    """{device: Room} for the devices whose room is known."""
    out: Dict[str, Room] = {}
    if snapshot is None:
        return out
    used = rec.rss_bytes or 0
    free = snapshot.memory.available_bytes + used
    out[rf.RAM] = Room(rf.RAM, "RAM", free, "")
    if rec.ram_budget_bytes is not None and rec.ram_budget_bytes < free:
        out[rf.RAM] = Room(rf.RAM, "RAM", rec.ram_budget_bytes, "its budget", used)
    space = address_space(rec)
    if space is not None and space < out[rf.RAM].free:
        # What the process may map at all bounds what it can hold (ulimit -v of its shell).
        out[rf.RAM] = Room(rf.RAM, "RAM", space, "its address-space limit (ulimit -v)", used)
    pids = set(rec.pids)
    for i, gpu in enumerate(_job_gpus(rec, snapshot.gpus)):
        if gpu.memory_free_bytes is None:
            continue
        held = sum(p.used_memory_bytes or 0 for p in gpu.processes if p.pid in pids)
        room = Room(f"GPU:{i}", f"GPU {gpu.index}", gpu.memory_free_bytes + held, "")
        limit = _limit_mb(rec, i)
        if limit is not None and limit * MiB < room.free:
            room = Room(room.device, room.label, limit * MiB, "its limit", held)
        if rec.vram_budget_bytes is not None and rec.vram_budget_bytes < room.free:
            room = Room(room.device, room.label, rec.vram_budget_bytes, "its budget", held)
        out[room.device] = room
    return out


def address_space(rec: JobRecord) -> Optional[int]:
    """The job's soft RLIMIT_AS from its spec (its shell's ``ulimit -v``), None: unlimited or
    not known."""
    limits = rec.spec.get("rlimits") if isinstance(rec.spec, Mapping) else None
    pair = limits.get("AS") if isinstance(limits, Mapping) else None
    if (
        isinstance(pair, (list, tuple))
        and pair
        and isinstance(pair[0], int)
        and not isinstance(pair[0], bool)
        and pair[0] > 0
    ):
        return int(pair[0])
    return None


def most_bytes(rec: JobRecord, snapshot: Optional[Snapshot]) -> Dict[str, Tuple[int, str]]:
    """{device: (the most bytes it can hold, what bounds it)}: RAM by the machine's RAM and
    swap, each of the job's GPUs by its total; {} without a reading."""
    if snapshot is None:
        return {}
    mem = snapshot.memory
    # The host's RAM when a cgroup limit is what total_bytes says: the larger one, to be safe.
    ram = max(mem.total_bytes, mem.host_total_bytes or 0) + max(0, mem.swap_total_bytes)
    out = {rf.RAM: (ram, "RAM and swap")}
    for i, gpu in enumerate(_job_gpus(rec, snapshot.gpus)):
        if gpu.memory_total_bytes:
            out[f"GPU:{i}"] = (gpu.memory_total_bytes, f"GPU {gpu.index}'s total")
    return out


def bounded(
    msg: Forecast, rec: JobRecord, snapshot: Optional[Snapshot]
) -> Tuple[Forecast, List[str]]:
    """``msg`` without what no device of this machine can hold: a device whose fixed, per-sample
    or peak bytes, or an accumulator whose bytes, are above the device's ``most_bytes``. Returns
    (the forecast kept, what was dropped: one line each, as ``messages.parse`` says it)."""
    most = most_bytes(rec, snapshot)
    dropped: List[str] = []

    def over(device: str, *figures: Optional[int]) -> bool:
        bound = most.get(device)
        if bound is None or max(f or 0 for f in figures) <= bound[0]:
            return False
        dropped.append(
            f"forecast: {one_line(device, 40)} above the machine's {bound[1]} "
            f"({format_bytes(bound[0])})"
        )
        return True

    devices = tuple(
        d
        for d in msg.devices
        if not over(d.device, d.fixed_bytes, d.per_sample_bytes, d.peak_bytes)
    )
    accumulators = tuple((name, size) for name, size in msg.accumulators if not over(name, size))
    if not dropped:
        return msg, []
    return dataclasses.replace(msg, devices=devices, accumulators=accumulators), dropped


def judge(
    msg: Forecast, rec: JobRecord, snapshot: Optional[Snapshot], floor: int
) -> Optional[Judgement]:
    """The sentence and the choice for a forecast; None when nothing of it can be compared.
    A figure above what the machine can hold is not judged (``bounded``)."""
    msg, _ = bounded(msg, rec, snapshot)
    batch = msg.batch or msg.micro_batch
    if not batch:
        return None
    devices = [d.to_json() for d in msg.devices]
    space = rooms(rec, snapshot)
    known = [d for d in devices if d["device"] in space]
    if not known:
        return None
    accumulators = dict(msg.accumulators)
    room = {name: r.free for name, r in space.items()}
    # The largest micro-batch that fits with the forecast's margin to spare, else the one that
    # fits at all: "does not fit" only when the forecast is above the room at every one.
    chosen = rf.choose(known, batch, floor, room, accumulators) or rf.choose(
        known, batch, floor, room, accumulators, margin=1.0
    )
    k_now = max(1, msg.accumulation or 1)
    micro_now = max(1, batch // k_now)
    # What it trains now, measured, against the room itself (the margin is for choosing).
    fits_now = all(
        rf.need(d, micro_now, k_now, accumulators.get(str(d["device"]), 0))
        <= space[str(d["device"])].free
        for d in known
    )

    def tightness(entry: Mapping[str, Any]) -> float:
        return rf.need(entry, batch, 1) / max(1, space[entry["device"]].free)

    tight = max(known, key=tightness)
    r = space[str(tight["device"])]
    need = rf.need(tight, batch, 1)
    about = "" if need >= BYTES_SHOWN_MAX else "about "  # not "about over 1024 EiB"
    text = f"needs {about}{format_bytes(need)} of {r.label} at batch {batch}; {r.said()}"
    outcome = (
        _outcome(chosen, batch, k_now, rec.shrinkable, floor)
        if not fits_now
        else ": it fits"
        if k_now == 1
        else f": it trains micro-batches of {micro_now} x {k_now} (the same training)"
    )
    return Judgement(text + outcome, fits_now, chosen[1] if chosen else 0, need, r.free)


def _outcome(
    chosen: Optional[Tuple[int, int]], batch: int, k_now: int, shrinkable: bool, floor: int
) -> str:
    """What happens to a fit whose micro-batch does not fit now."""
    if chosen is None:
        return f": it does not fit even at micro-batches of {floor}"
    micro, k = chosen
    if k == 1:
        return ": it fits at the full batch"
    if not shrinkable or k <= k_now:
        return f": it would fit at micro-batches of {micro} x {k}, but it cannot shrink"
    return f": it will train micro-batches of {micro} x {k} (the same training)"


# Where a forecast's figure comes from: its event says so (a job has one of each, or more).
_SOURCES = {
    rf.PROBE: " (a forecast from a trial at a small batch, before training)",
    rf.STEPS: " (measured over its first steps)",
}


def source_said(how: Optional[str]) -> str:
    """What a forecast's event adds after its verdict: where its figure comes from."""
    return _SOURCES.get(how or "", "")


def ram_need(msg: Forecast) -> Optional[int]:
    """The RAM (bytes) the fit needs at the micro-batch it trains, from its forecast; None
    where it has no RAM figure (the guard's rule for resuming a job paused mid-step)."""
    batch = msg.batch or msg.micro_batch
    if not batch:
        return None
    k = max(1, msg.accumulation or 1)
    micro = max(1, msg.micro_batch or batch // k)
    for d in msg.devices:
        if d.device == rf.RAM:
            return rf.need(d.to_json(), micro, k, dict(msg.accumulators).get(rf.RAM, 0))
    return None
