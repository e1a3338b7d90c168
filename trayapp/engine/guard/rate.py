"""The guard's fill rate and its sampling interval.

The fill rate is a least-squares slope over the last ``rate_window_seconds`` of samples (at
least three), counted only when the fit is clear of its own noise. The interval is the
headroom to the next threshold over the fill rate (``next_interval``), so a filling machine
is sampled faster the nearer it gets; ``wants_gpus`` says when VRAM is near enough a threshold
for the GPUs to be read every tick.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, List, Optional, Tuple

from trayapp.engine.guard.model import (
    RUNNING_STATES,
    CondKey,
    GuardInput,
    GuardState,
    Policy,
    Thresholds,
    Watch,
)
from trayapp.vocab import GuardMode as M

# Sampling: the interval is headroom / (SAFETY_FACTOR x fill rate), so a steady fill crosses
# the next threshold only after about four more samples; never faster than MIN_INTERVAL.
MIN_INTERVAL_SECONDS = 0.02
GPU_MIN_INTERVAL_SECONDS = 0.1  # NVML costs milliseconds a read; VRAM never needs 50 Hz
SAFETY_FACTOR = 4.0
# A burst the history cannot show yet: one Python process touches fresh pages at 1-4 GB/s.
# Sizing the interval for at least this rate keeps a small headroom sampled often.
BURST_RATE_BYTES_PER_S = float(1 << 30)
JOB_BURST_RATE_BYTES_PER_S = float(256 << 20)
# Below this a fill rate is noise (page cache, allocator churn) and predicts nothing.
NOISE_RATE_BYTES_PER_S = float(1 << 20)
MIN_FIT_SAMPLES = 3
# The fill must go on over the last second, at a quarter of the fitted rate or more.
RECENT_WINDOW_SECONDS = 1.0
RECENT_SHARE = 0.25
# GPUs are read every tick (not once a second) within this many points of the VRAM warning,
# and while a job is past this share of its VRAM budget.
VRAM_NEAR_POINTS = 5.0
VRAM_BUDGET_NEAR_SHARE = 0.8
# A sample this much older than the last one means the wall clock was set back.
CLOCK_STEP_SECONDS = 1.0
MEM = "mem"  # history series: minus available memory, so a positive slope means filling


@dataclass(frozen=True)
class Fit:
    """A least-squares slope over recent samples. ``rate`` is in units per second."""

    rate: float
    samples: int
    span_seconds: float
    significant: bool  # the change over the window stands clear of the scatter around the line
    last_step_rate: Optional[float]  # slope of the last two samples (no smoothing)


class FillHistory:
    """The last ``keep_seconds`` of samples per series: ``mem`` (minus available memory),
    ``rss:<job>`` and ``vram:<job>``. Fed by the service; read by the decision."""

    def __init__(self, keep_seconds: float = 30.0, max_samples: int = 4096):
        self.keep_seconds = keep_seconds
        self.max_samples = max_samples
        self._series: Dict[str, Deque[Tuple[float, float]]] = {}

    def add(self, name: str, t: float, value: float) -> None:
        d = self._series.get(name)
        if d is None:
            d = self._series[name] = deque(maxlen=self.max_samples)
        if d and t <= d[-1][0]:
            if t == d[-1][0]:
                d[-1] = (t, float(value))
            elif d[-1][0] - t > CLOCK_STEP_SECONDS:
                d.clear()  # the wall clock was set back: the old samples say nothing now
                d.append((t, float(value)))
            return
        d.append((t, float(value)))
        horizon = t - self.keep_seconds
        while d and d[0][0] < horizon:
            d.popleft()

    def record(self, inp: GuardInput) -> None:
        """Add one input's readings; series of jobs that ended are dropped."""
        t = inp.time
        self.add(MEM, t, -float(inp.memory.available_bytes))
        live = {MEM}
        for job in inp.jobs:
            if job.rss_bytes is not None:
                self.add(f"rss:{job.id}", t, job.rss_bytes)
                live.add(f"rss:{job.id}")
            if job.vram_bytes is not None:
                self.add(f"vram:{job.id}", t, job.vram_bytes)
                live.add(f"vram:{job.id}")
        for name in [n for n in self._series if n not in live]:
            last = self._series[name]
            if not last or t - last[-1][0] > self.keep_seconds:
                del self._series[name]

    def samples(self, name: str) -> List[Tuple[float, float]]:
        return list(self._series.get(name, ()))

    def fit(
        self, name: str, now: float, window: float, since: Optional[float] = None
    ) -> Optional[Fit]:
        """The slope of ``name`` over the last ``window`` seconds (samples from ``since`` on).

        Fewer than three samples in the window: the last three (no older than four windows).
        None when there are fewer than two samples.
        """
        d = self._series.get(name)
        if not d or len(d) < 2:
            return None
        start = now - window
        floor = since if since is not None else -math.inf
        pts: List[Tuple[float, float]] = []
        oldest = now - 4 * window
        for t, v in reversed(d):
            if t < floor or t < oldest:
                break
            if t < start and len(pts) >= MIN_FIT_SAMPLES:
                break
            pts.append((t, v))
        pts.reverse()
        (t1, v1), (t2, v2) = d[-2], d[-1]
        last_step = (v2 - v1) / (t2 - t1) if t2 > t1 else None
        if len(pts) < 2:
            return Fit(0.0, len(pts), 0.0, False, last_step)
        return _least_squares(pts, last_step)


def _least_squares(pts: List[Tuple[float, float]], last_step: Optional[float]) -> Fit:
    n = len(pts)
    t0 = pts[0][0]
    mt = sum(t - t0 for t, _ in pts) / n
    mv = sum(v for _, v in pts) / n
    stt = sum((t - t0 - mt) ** 2 for t, _ in pts)
    span = pts[-1][0] - t0
    if stt <= 0 or span <= 0:
        return Fit(0.0, n, 0.0, False, last_step)
    slope = sum((t - t0 - mt) * (v - mv) for t, v in pts) / stt
    resid = [v - (mv + slope * (t - t0 - mt)) for t, v in pts]
    scatter = math.sqrt(sum(r * r for r in resid) / max(1, n - 2))
    significant = (
        n >= MIN_FIT_SAMPLES
        and abs(slope) >= NOISE_RATE_BYTES_PER_S
        and abs(slope) * span > 2.0 * scatter
    )
    return Fit(slope, n, span, significant, last_step)


def fill_rate(
    history: FillHistory, now: float, policy: Policy, since: Optional[float]
) -> Optional[float]:
    """The significant fill rate of available memory (bytes/s, positive), or None."""
    fit = history.fit(MEM, now, policy.rate_window_seconds, since=since)
    rate = fit.rate if fit is not None and fit.significant and fit.rate > 0 else None
    if rate is not None:
        # The last second must still show the fill: a burst that has ended (a job importing
        # TensorFlow) stays in the window for a while but predicts nothing.
        recent = history.fit(MEM, now, RECENT_WINDOW_SECONDS, since=since)
        if recent is None or recent.rate < RECENT_SHARE * rate:
            rate = None
    return rate


# -- sampling ---------------------------------------------------------------------------------


def wants_gpus(inp: Optional[GuardInput], policy: Policy) -> bool:
    """Whether VRAM is near a threshold, so the GPUs should be read every tick."""
    if inp is None:
        return False
    for g in inp.gpus:
        if (
            g.memory_total_bytes
            and g.memory_used_bytes is not None
            and 100.0 * g.memory_used_bytes / g.memory_total_bytes
            >= policy.vram_warn_percent - VRAM_NEAR_POINTS
        ):
            return True
    for j in inp.jobs:
        if (
            j.vram_budget_bytes
            and j.vram_bytes is not None
            and j.state in RUNNING_STATES
            and j.vram_bytes >= VRAM_BUDGET_NEAR_SHARE * j.vram_budget_bytes
        ):
            return True
    return False


def next_interval(
    inp: Optional[GuardInput],
    history: FillHistory,
    policy: Policy,
    base_seconds: float,
    state: Optional[GuardState] = None,
) -> float:
    """Seconds until the next sample: the headroom to the next threshold divided by the fill
    rate (times ``SAFETY_FACTOR``, and at least a burst rate), between ``MIN_INTERVAL_SECONDS``
    and ``base_seconds``. Each job's budget counts as a threshold too."""
    upper = max(MIN_INTERVAL_SECONDS, base_seconds)
    if inp is None or policy.mode == M.OFF:
        return upper
    now = inp.time
    best = upper
    th = Thresholds.of(policy, max(1, inp.memory.total_bytes))
    avail = inp.memory.available_bytes
    headroom = max(0, avail - th.below(avail))
    best = min(
        best,
        _interval(
            headroom, history.fit(MEM, now, policy.rate_window_seconds), BURST_RATE_BYTES_PER_S
        ),
    )
    share = policy.budget_warn_percent / 100.0
    for j in inp.jobs:
        if j.state not in RUNNING_STATES:
            continue
        if j.ram_budget_bytes and j.rss_bytes is not None:
            nxt = (
                share * j.ram_budget_bytes
                if j.rss_bytes < share * j.ram_budget_bytes
                else float(j.ram_budget_bytes)
            )
            if state is not None:
                nxt = max(nxt, state.grace.get(CondKey(Watch.RAM, j.id), 0.0))
            if j.rss_bytes < nxt:
                fit = history.fit(f"rss:{j.id}", now, policy.rate_window_seconds)
                best = min(best, _interval(nxt - j.rss_bytes, fit, JOB_BURST_RATE_BYTES_PER_S))
    if wants_gpus(inp, policy):
        best = min(best, max(GPU_MIN_INTERVAL_SECONDS, _gpu_interval(inp, history, policy, upper)))
    return max(MIN_INTERVAL_SECONDS, min(upper, best))


def _interval(headroom: float, fit: Optional[Fit], burst: float) -> float:
    rate = 0.0
    if fit is not None:
        if fit.significant:
            rate = max(rate, fit.rate)
        if fit.last_step_rate is not None:
            rate = max(rate, fit.last_step_rate)
    return headroom / max(SAFETY_FACTOR * rate, burst)


def _gpu_interval(inp: GuardInput, history: FillHistory, policy: Policy, upper: float) -> float:
    best = upper
    for j in inp.jobs:
        if (
            j.vram_budget_bytes
            and j.vram_bytes is not None
            and j.state in RUNNING_STATES
            and j.vram_bytes < j.vram_budget_bytes
        ):
            fit = history.fit(f"vram:{j.id}", inp.time, policy.rate_window_seconds)
            best = min(
                best, _interval(j.vram_budget_bytes - j.vram_bytes, fit, JOB_BURST_RATE_BYTES_PER_S)
            )
    return best
