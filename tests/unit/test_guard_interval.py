"""The adaptive sampling interval against headroom and fill rate, and when GPUs are read."""

from __future__ import annotations

from typing import Optional, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trayapp.config import Threshold
from trayapp.engine.guard import (
    BURST_RATE_BYTES_PER_S,
    MIN_INTERVAL_SECONDS,
    SAFETY_FACTOR,
    FillHistory,
    GuardInput,
    JobView,
    Policy,
    next_interval,
    wants_gpus,
)
from trayapp.readings import GpuReading, MemoryReading

MiB = 1 << 20
GiB = 1 << 30
TOTAL = 16 * GiB
WARN = int(TOTAL * 0.15)
PAUSE = int(TOTAL * 0.08)


def reading(avail: int, t: float) -> MemoryReading:
    return MemoryReading(time=t, total_bytes=TOTAL, available_bytes=int(avail),
                         used_bytes=TOTAL - int(avail), swap_total_bytes=0, swap_used_bytes=0,
                         psi_some_avg10=0.0, psi_full_avg10=0.0)


def interval_after(avails: Sequence[float], step: float = 0.1, base: float = 1.0,
                   policy: Policy = Policy(), jobs: Sequence[JobView] = ()) -> float:
    """The interval after a run of readings ``step`` seconds apart."""
    h = FillHistory()
    inp: Optional[GuardInput] = None
    for i, a in enumerate(avails):
        inp = GuardInput(i * step, reading(int(a), i * step), jobs=tuple(jobs))
        h.record(inp)
    return next_interval(inp, h, policy, base)


def steady_fall(start: float, rate: float, n: int = 20, step: float = 0.1) -> list:
    return [start - rate * i * step for i in range(n)]


def test_calm_is_the_base_interval() -> None:
    assert interval_after([12 * GiB] * 10) == 1.0
    assert interval_after([12 * GiB] * 10, base=2.0) == 2.0
    assert next_interval(None, FillHistory(), Policy(), 1.0) == 1.0


def test_guard_off_samples_at_the_base_rate() -> None:
    assert interval_after([PAUSE + 10 * MiB] * 5, policy=Policy(mode="off")) == 1.0


@pytest.mark.parametrize("headroom_mib", [800, 400, 200, 100, 50, 10])
def test_small_headroom_without_a_measured_rate(headroom_mib: int) -> None:
    # Flat just above the warning threshold: sized for a burst of BURST_RATE.
    iv = interval_after([WARN + headroom_mib * MiB] * 10)
    expected = max(MIN_INTERVAL_SECONDS, headroom_mib * MiB / BURST_RATE_BYTES_PER_S)
    assert iv == pytest.approx(expected, rel=0.05)


TABLE = [
    # headroom above the pause threshold (MiB), fill rate (MB/s), expected interval (s)
    (4096, 0, 1.0),
    (4096, 500, 1.0),  # 4 GiB at 2 GB/s (x4 safety): 2 s, above the base
    (2048, 1000, 0.54),  # 2 GiB / (4 x 1 GB/s)
    (1024, 1000, 0.27),
    (512, 1000, 0.134),
    (1024, 2000, 0.134),
    (100, 2000, 0.02),  # floor: 100 MiB / 8 GB/s = 13 ms
]


@pytest.mark.parametrize("headroom_mib,rate_mb,expected", TABLE)
def test_interval_against_headroom_and_rate(headroom_mib: int, rate_mb: float,
                                            expected: float) -> None:
    # Available falls at the rate and ends ``headroom`` above the pause threshold (the
    # warning threshold is put at the same place, so the pause threshold is the next one).
    end = PAUSE + headroom_mib * MiB
    rate = rate_mb * 1e6
    avails = [end + rate * (19 - i) * 0.1 for i in range(20)]
    iv = interval_after(avails, policy=Policy(warn_available=Threshold(percent=8.0)))
    assert iv == pytest.approx(expected, rel=0.1, abs=0.005)


def test_interval_shrinks_as_headroom_shrinks() -> None:
    rate = 500e6
    ivs = [interval_after(steady_fall(PAUSE + h * MiB + rate * 1.9, rate))
           for h in (1000, 500, 250, 120, 60)]
    assert ivs == sorted(ivs, reverse=True) and ivs[0] > ivs[-1] * 8


def test_interval_shrinks_as_the_rate_rises() -> None:
    end = PAUSE + 1000 * MiB
    ivs = [interval_after(steady_fall(end + r * 1.9, r)) for r in (300e6, 600e6, 1.2e9, 2.4e9)]
    assert ivs == sorted(ivs, reverse=True)
    assert ivs[1] == pytest.approx(ivs[2] * 2, rel=0.1)


def test_a_sudden_jump_is_caught_from_the_last_step() -> None:
    # Calm at 1 Hz, then 1 GB gone in the last second: the least-squares fit of three
    # samples lags; the last step does not.
    avails = [6 * GiB, 6 * GiB, 6 * GiB, 6 * GiB - 1e9]
    iv = interval_after(avails, step=1.0)
    assert iv == pytest.approx((6 * GiB - 1e9 - WARN) / (SAFETY_FACTOR * 1e9), rel=0.05)


def test_a_rising_memory_does_not_speed_up_sampling() -> None:
    assert interval_after([4 * GiB + i * 100 * MiB for i in range(20)]) == 1.0


def test_a_job_near_its_budget_is_sampled_faster() -> None:
    j = JobView("j1", "hog", "running", (1,), rss_bytes=200 * MiB, ram_budget_bytes=300 * MiB)
    # 70 MiB to the warning share (270 MiB), sized for a 256 MiB/s burst: ~0.27 s.
    assert interval_after([12 * GiB] * 5, jobs=[j]) == pytest.approx(70 / 256, rel=0.05)
    far = JobView("j1", "hog", "running", (1,), rss_bytes=10 * MiB, ram_budget_bytes=8 * GiB)
    assert interval_after([12 * GiB] * 5, jobs=[far]) == 1.0
    done = JobView("j1", "hog", "paused", (1,), rss_bytes=290 * MiB, ram_budget_bytes=300 * MiB)
    assert interval_after([12 * GiB] * 5, jobs=[done]) == 1.0  # a paused job does not grow


@settings(max_examples=200, deadline=None)
@given(avail=st.integers(0, TOTAL), rate=st.floats(-3e9, 3e9), base=st.floats(0.05, 5.0))
def test_interval_stays_within_bounds(avail: int, rate: float, base: float) -> None:
    avails = [max(0.0, avail + rate * (9 - i) * 0.1) for i in range(10)]
    iv = interval_after(avails, base=base)
    assert MIN_INTERVAL_SECONDS <= iv <= base


# -- GPUs -------------------------------------------------------------------------------------


def gpu(used_percent: float) -> GpuReading:
    total = 8 * GiB
    used = int(total * used_percent / 100)
    return GpuReading(0, "RTX 4070", "GPU-x", total, used, total - used)


@pytest.mark.parametrize("used,vram,budget,expected", [
    (50.0, None, None, False),
    (89.0, None, None, False),
    (91.0, None, None, True),  # within 5 points of the 95% warning
    (99.0, None, None, True),
    (50.0, 700 * MiB, 1 * GiB, False),
    (50.0, 900 * MiB, 1 * GiB, True),  # past 80% of its VRAM budget
])
def test_gpus_are_read_every_tick_only_near_a_threshold(used: float, vram: Optional[int],
                                                        budget: Optional[int],
                                                        expected: bool) -> None:
    jobs = (JobView("j1", "t", "running", (1,), 0, vram, vram_budget_bytes=budget),)
    inp = GuardInput(0.0, reading(12 * GiB, 0.0), (gpu(used),), jobs)
    assert wants_gpus(inp, Policy()) is expected
    assert wants_gpus(None, Policy()) is False


def test_history_survives_the_clock_being_set_back() -> None:
    h = FillHistory()
    for i in range(5):
        h.add("mem", 1000.0 + i, -float(10 * GiB - i * 100 * MiB))
    h.add("mem", 1003.5, -1.0)  # a little out of order: ignored
    assert len(h.samples("mem")) == 5
    h.add("mem", 400.0, -float(9 * GiB))  # set back ten minutes: start afresh
    h.add("mem", 401.0, -float(9 * GiB - 200 * MiB))
    assert [t for t, _ in h.samples("mem")] == [400.0, 401.0]
    fit = h.fit("mem", 401.0, 3.0)
    assert fit is not None and fit.last_step_rate == pytest.approx(200 * MiB)  # filling
