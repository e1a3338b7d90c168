"""A job's time left, estimated from the rate its training steps go by (pure)."""

from __future__ import annotations

from typing import Optional, Tuple

from trayapp.jobs.record import JobRecord

RATE_MIN_SECONDS = 1.0  # a rate is measured over this long at least

# (monotonic time, progress units done then): where the rate is measured from.
RateRef = Optional[Tuple[float, float]]


def progress_units(rec: JobRecord) -> Tuple[Optional[float], Optional[float]]:
    """(done, total) training steps over all epochs, from the runner's 1-based epoch and the
    steps done in it; (None, None) when the runner does not know."""
    epoch, epochs, step, steps = rec.epoch, rec.epochs, rec.step, rec.steps
    if not epochs or epoch is None:
        return None, None
    if steps is not None and steps > 0:
        done = max(0.0, (epoch - 1) * steps + float(step or 0))
        return done, float(epochs * steps)
    return max(0.0, float(epoch) - 1), float(epochs)


def estimate(rec: JobRecord, ref: RateRef, now: float) -> Tuple[RateRef, Optional[float], bool]:
    """(the rate's reference from now on, the ETA in seconds, whether the ETA changed).

    The rate is measured from the first progress seen (again after progress went back: a new
    fit()); the ETA stays what it was until a second has passed and a step was done."""
    done, total = progress_units(rec)
    if done is None or total is None:
        return ref, None, True
    if ref is None or done < ref[1]:
        return (now, done), rec.eta_seconds, False
    t0, d0 = ref
    if now - t0 < RATE_MIN_SECONDS or done <= d0:
        return ref, rec.eta_seconds, False
    rate = (done - d0) / (now - t0)
    return ref, max(0.0, (total - done) / rate), True
