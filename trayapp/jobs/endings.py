"""How a job ended: its state, end reason and the event that says so, from its state when its
process ended, the runner's bye, the exit status and who parked or stopped it. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from trayapp.jobs import messages
from trayapp.jobs.job import signal_name
from trayapp.jobs.record import JobRecord
from trayapp.runner import protocol as rp
from trayapp.vocab import EventKind as E
from trayapp.vocab import JobState as S


@dataclass(frozen=True)
class Ending:
    """How a job ended: its state and end reason, and the event that says so."""

    state: str
    reason: str
    kind: str
    level: str
    message: str


def ending(
    rec: JobRecord,
    code: Optional[int],
    park_note: Tuple[str, str],
    stop_note: Tuple[str, str],
    adopted_gone: bool = False,
) -> Ending:
    """How the job of ``rec`` ended with exit status ``code`` (None: unknown), from its state,
    the runner's bye and who parked or stopped it."""
    said = rec.bye.reason if rec.bye is not None else None
    head = f"job {rec.id} ({rec.name})"
    # Parked only when the engine asked for it: a job that says "parked" unasked exited.
    if rec.state == S.PARKING and (
        code == rp.PARK_EXIT_CODE or (code is None and said == messages.BYE_PARKED)
    ):
        by, why = park_note
        reason = f"parked by {by}" + (f": {why}" if why else "")
        return Ending(
            S.PARKED,
            reason,
            E.JOB_PARKED,
            "info",
            f"{head} parked; resume it with 'headroom resume {rec.id}'",
        )
    if rec.state == S.STOPPING or (said == messages.BYE_STOPPED and code == rp.STOP_EXIT_CODE):
        by, why = stop_note
        reason = f"stopped by {by}" + (f": {why}" if why else "")
        message = f"{head} {reason}"
        if rec.checkpoint_dir and not rec.is_kernel:
            message += f"; continue it from its checkpoint with 'headroom resume {rec.id}'"
        return Ending(S.STOPPED, reason, E.JOB_STOPPED, "info", message)
    # The job's own word, where it claimed a park it was not asked for: kept, not believed.
    claim = (
        "; it said it parked, which Headroom had not asked" if said == messages.BYE_PARKED else ""
    )
    if code is None:
        reason = (
            "the process ended while no engine watched it (exit status unknown)"
            if adopted_gone
            else "the process ended (exit status unknown)"
        )
        return Ending(S.LOST, reason + claim, E.JOB_LOST, "warn", f"{head}: {reason}{claim}")
    if code == 0:
        return Ending(S.FINISHED, S.FINISHED.value, E.JOB_FINISHED, "info", f"{head} finished")
    reason = f"killed by {signal_name(-code)}" if code < 0 else f"exit status {code}"
    return Ending(
        S.FAILED, reason + claim, E.JOB_FAILED, "error", f"{head} failed ({reason}{claim})"
    )


def bye_code(rec: JobRecord) -> Optional[int]:
    code = rec.bye.exit_code if rec.bye is not None else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None
