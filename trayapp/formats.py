"""How numbers read to a user, the same in the terminal and in the tray: sizes, percentages,
durations, clock times and a job's training progress.

Stdlib only and no Qt: the CLI and the UI both use it. A value that is not known (``None``)
reads "n/a", never 0.
"""

from __future__ import annotations

import math
import time
from typing import Any, List, Mapping, Optional

NA = "n/a"
# A start time older than this is shown with its date.
RECENT_SECONDS = 20 * 3600


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
# No memory holds this much (2**70): a larger figure is a bad one, never printed in full.
BYTES_SHOWN_MAX = 1024.0 ** len(_UNITS)


def format_bytes(n: Optional[float], digits: int = 1) -> str:
    """Bytes in binary units (``1536`` -> ``"1.5 KiB"``), up to EiB; ``None`` (or a float that
    is not finite) reads "n/a", a size of 1024 EiB or more "over 1024 EiB" (a negative one
    "under -1024 EiB")."""
    if n is None:
        return NA
    try:
        n = float(n)
    except OverflowError:  # an integer beyond any float
        n = BYTES_SHOWN_MAX if n > 0 else -BYTES_SHOWN_MAX
    if not math.isfinite(n):
        return NA
    if abs(n) >= BYTES_SHOWN_MAX:
        return "over 1024 EiB" if n > 0 else "under -1024 EiB"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in _UNITS:
        if n < 1024 or unit == _UNITS[-1]:
            break
        n /= 1024
    if unit == "B":
        return f"{sign}{int(n)} B"
    # At most four digits before the point (1023.96 KiB reads "1024.0 KiB").
    return f"{sign}{n:.{digits}f} {unit}"


def percent(part: Optional[float], whole: Optional[float]) -> str:
    """``part`` as a share of ``whole`` (``"42%"``); "n/a" when either is not known or the
    whole is 0."""
    if part is None or not whole:
        return NA
    return f"{100.0 * float(part) / float(whole):.0f}%"


def number(value: Optional[float], unit: str, digits: int = 0) -> str:
    """``value`` with ``digits`` decimals and its unit (``"71°C"``, ``" W"``: the unit says
    whether a space goes before it); "n/a" when not known."""
    return NA if value is None else f"{value:.{digits}f}{unit}"


def duration(seconds: Optional[float], compact: bool = False) -> str:
    """A duration in words (``3725`` -> ``"1 h 2 min"``, the UI's) or ``compact``
    (``"1h02m"``, ``"5m03s"``, ``"7s"``, the terminal's); "n/a" when not known."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return NA
    if compact:
        s = int(round(seconds))
        if s >= 3600:
            return f"{s // 3600}h{s % 3600 // 60:02d}m"
        if s >= 60:
            return f"{s // 60}m{s % 60:02d}s"
        return f"{s}s"
    s = max(0, int(round(float(seconds))))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s" if s < 600 else f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {(s % 3600) // 60} min"
    return f"{s // 86400} d {(s % 86400) // 3600} h"


def clock(t: float) -> str:
    """A time of day, local (``"14:03:27"``)."""
    return time.strftime("%H:%M:%S", time.localtime(t))


def started(t: Optional[float], now: Optional[float] = None) -> str:
    """When something started: the time of day within the last 20 hours, else the date and
    the time (``"Mar 04 09:12"``); "n/a" when not known."""
    if not t:
        return NA
    now = time.time() if now is None else now
    if now - t < RECENT_SECONDS:
        return clock(t)
    return time.strftime("%b %d %H:%M", time.localtime(t))


def progress_parts(
    epoch: Optional[int], epochs: Optional[int], step: Optional[int], steps: Optional[int]
) -> List[str]:
    """A job's training position, ``["epoch 2/10", "step 120/500"]``: an epoch count only when
    the job reports its epochs, a step count only when it reports its steps."""
    parts = []
    if epochs:
        parts.append(f"epoch {epoch or 0}/{epochs}")
    if steps:
        parts.append(f"step {step or 0}/{steps}")
    return parts


def progress(
    epoch: Optional[int],
    epochs: Optional[int],
    step: Optional[int],
    steps: Optional[int],
    sep: str = ", ",
) -> str:
    """``progress_parts`` joined by ``sep`` (``"epoch 2/10, step 120/500"``); "" when the job
    reports no progress."""
    return sep.join(progress_parts(epoch, epochs, step, steps))


def batch(size: Optional[int], micro: Optional[int], accumulation: Optional[int]) -> str:
    """A shrunk batch, ``"batch 256 = 64 x 4"`` (the effective batch, trained as micro-batches
    accumulated before each update); "" for a batch as the user gave it."""
    if not size or not micro or not accumulation or accumulation <= 1:
        return ""
    return f"batch {size} = {micro} x {accumulation}"


def loss(value: Optional[float]) -> str:
    """A loss with four significant digits (``"0.1234"``); "" when there is none."""
    return "" if value is None else f"{value:.4g}"


def checkpoint_at(epoch: Optional[int], step: Optional[int]) -> str:
    """Where a checkpoint stands, numbered as Keras prints the epochs (from 1). ``epoch`` is
    the runner's: the epoch training starts from, counted from 0 (the epochs done), and
    ``step`` the batches of it done: (14, 67) is "epoch 15, batch 67", (15, 0) "end of epoch
    15", (0, 0) "before epoch 1"; "" when the epoch is not known."""
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        return ""
    if isinstance(step, int) and not isinstance(step, bool) and step > 0:
        return f"epoch {epoch + 1}, batch {step}"
    return f"end of epoch {epoch}" if epoch else "before epoch 1"


def exhaustion_words(guard: Mapping[str, Any]) -> str:
    """ "memory runs out in ~9 min 39 s" from the guard's status where it predicts it and is
    not at ease; "" otherwise. At ease ("ok"), the prediction is a straight line through a few
    seconds of growth beyond the guard's own horizon (a job loading its data, with 22 GiB free):
    said, it reads as an alarm the guard does not raise."""
    tte = guard.get("seconds_to_exhaustion")
    state = guard.get("state") or "ok"
    if not isinstance(tte, (int, float)) or isinstance(tte, bool) or state == "ok":
        return ""
    return f"memory runs out in ~{duration(tte)}"
