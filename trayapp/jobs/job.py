"""One job as the job manager holds it: its record (``JobRecord``, replaced as the job changes)
and what only the manager keeps (its process, channel, stop ladder, sampling times).

Also the small pieces every part of the manager shares: how a state is set (``move``), the
event tuple collected under the lock and emitted after it, the pause modes.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from typing import Any, Callable, Dict, Optional, Tuple

import psutil

from trayapp.channel import ChannelServer, Peer
from trayapp.jobs.ladder import Stage
from trayapp.jobs.record import JobRecord
from trayapp.jsonvalue import JSONObject
from trayapp.vocab import Actor, PauseMode
from trayapp.vocab import JobState as S

log = logging.getLogger("headroom.jobs")

MIB = 1024 * 1024

# How a paused job was paused (``JobRecord.pause_mode``).
COOPERATIVE: str = PauseMode.COOPERATIVE  # the runner waits at a batch end
SUSPENDED: str = PauseMode.SUSPENDED  # every process of the tree got SIGSTOP

# Who asked (``paused_by``, ``parked_by``, ``stopped_by``) when no one else did.
BY_USER: str = Actor.USER
BY_GUARD: str = Actor.GUARD
BY_ENGINE: str = Actor.ENGINE
# Who acted on a job (the record's paused_by, parked_by, stopped_by), as a user reads it.
_WHO = {BY_USER: "you", BY_GUARD: "the guard", BY_ENGINE: "the engine"}


def who(by: Optional[str]) -> str:
    """``"user"`` -> ``"you"``, ``"guard"`` -> ``"the guard"``; another word as it is."""
    return _WHO.get(by or "", by or "")


Emit = Callable[..., Any]
# An event to emit once the lock is released: (kind, level, message, job id, data).
Event = Tuple[str, str, str, Optional[str], Optional[JSONObject]]


class Job:
    """One job: its record (``rec``) and what only the manager holds."""

    def __init__(self, rec: JobRecord, key: bytes):
        self.rec = rec
        self.key = key
        self.popen: Optional[subprocess.Popen] = None  # our own child
        self.process: Optional[psutil.Process] = None  # the root, ours or adopted
        self.server: Optional[ChannelServer] = None
        self.peer: Optional[Peer] = None
        # Every process seen in the tree, so remnants reparented away are still found.
        self.known: Dict[int, psutil.Process] = {}
        self.next_sample = 0.0
        self.last_saved = 0.0
        self.dirty = False
        self.pause_deadline: Optional[float] = None  # monotonic
        self.stop_stage = Stage.NONE
        self.stop_next = 0.0  # monotonic time of the next stop step
        self.stop_grace = False  # the runner's "stopping" got its time to save (once a stop)
        self.stop_note: Tuple[str, str] = (BY_USER, "")
        self.park_note: Tuple[str, str] = (BY_USER, "")
        # Parked to be relaunched at once, training micro-batches with this accumulation.
        self.smaller: Optional[int] = None
        self.rate_ref: Optional[Tuple[float, float]] = None  # (time, progress units)
        self.exit_seen = False
        self.meter: Any = None  # the tree's TreeMeter (pages counted once), made on first use
        self.forecasts_said = 0  # forecast events of this job (at most MAX_FORECAST_EVENTS)
        self.fit_answers = 0  # --fit-batch answers sent (at most MAX_FIT_ANSWERS)
        self.note_window = (-60.0, 0)  # (monotonic start of the minute, note events in it)
        # The kernel brake (trayapp.jobs.braking): the job's cgroups (None: the guard only)
        # and what the brake keeps of this run (a BrakeState).
        self.cgroup: Any = None
        self.brake: Any = None

    @property
    def id(self) -> str:
        return self.rec.id

    @property
    def state(self) -> str:
        return self.rec.state

    def change(self, **changes: Any) -> None:
        """Replace the record with one with ``changes`` (not the state: ``JobTable.move``)."""
        self.rec = self.rec.with_(**changes)


def now() -> float:
    return time.time()


def signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


def resumable_stop(rec: JobRecord, state: str) -> bool:
    """A stopped job with a checkpoint folder continues from it on ``resume``."""
    return state == S.STOPPED and bool(rec.checkpoint_dir) and not rec.is_kernel


def budget_bytes(mb: Any) -> Optional[int]:
    """A budget of the spec (``ram_budget_mb``, ``vram_budget_mb``) in bytes; None: none."""
    if isinstance(mb, (int, float)) and not isinstance(mb, bool):
        return int(mb * MIB)
    return None
