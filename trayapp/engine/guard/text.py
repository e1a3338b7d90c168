"""The guard's sentences: the reasons it gives, the lines of its notifications and events.

Plain functions of numbers and names (nothing here knows the guard's types), so a sentence
can change without touching a rule, and a rule without touching a sentence.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Optional, Tuple

from trayapp.config import Threshold, format_bytes
from trayapp.readings import GpuReading
from trayapp.vocab import GuardAct as A
from trayapp.vocab import GuardCause as C

# -- names and numbers ------------------------------------------------------------------------


def job_label(job_id: str, name: str) -> str:
    """ "job a1 (train.py)", or "job a1" without a name."""
    return f"job {job_id} ({name})" if name else f"job {job_id}"


def process_label(name: str, pid: int) -> str:
    return f"process {name} (pid {pid})"


def format_rate(rate: Optional[float]) -> str:
    """``+300.0 MiB/s``; "n/a" for None."""
    if rate is None:
        return "n/a"
    return ("+" if rate >= 0 else "-") + format_bytes(abs(rate)) + "/s"


def share(part: float, whole: float) -> str:
    """ "42%" of ``whole``; "n/a" when it is 0."""
    return f"{100.0 * part / whole:.0f}%" if whole else "n/a"


def _th_text(value: int, setting: Threshold) -> str:
    if setting.percent is not None:
        return f"{format_bytes(value)} ({setting})"
    return format_bytes(value)


def top_text(rows: Iterable[Tuple[str, int, Optional[float]]], limit: int = 3) -> str:
    """ "filling: job a1 (train.py) 2.0 GiB (+300.0 MiB/s); largest: firefox 3.1 GiB", or "",
    from (who, bytes, growth worth naming or None) rows: at most ``limit`` named, those growing
    first (fastest first, then the larger), then the largest of the rest."""
    all_rows = list(rows)
    growing = sorted(
        (r for r in all_rows if r[2] is not None and r[2] > 0),
        key=lambda r: (-(r[2] or 0.0), -r[1]),
    )[:limit]
    rest = sorted((r for r in all_rows if r not in growing), key=lambda r: -r[1])[
        : max(0, limit - len(growing))
    ]
    parts = []
    if growing:
        parts.append(
            "filling: "
            + ", ".join(
                f"{who} {format_bytes(size)} ({format_rate(rate)})" for who, size, rate in growing
            )
        )
    if rest:
        parts.append(
            "largest: " + ", ".join(f"{who} {format_bytes(size)}" for who, size, _ in rest)
        )
    return "; ".join(parts)


# -- conditions -------------------------------------------------------------------------------

# The memory ladder's steps, as its sentences name them.
STEP_WORDS: Mapping[str, str] = {
    C.MEM_STOP: "last-resort",
    C.MEM_PARK: "park",
    C.MEM_PAUSE: "pause",
    C.MEM_WARN: "warning",
}


def memory_have(avail: int, total: int, limit_source: str) -> str:
    """ "1.1 GiB (7% of 16.0 GiB)", with "(cgroup limit)" when the total is a cgroup's."""
    where = " (cgroup limit)" if limit_source == "cgroup" else ""
    return f"{format_bytes(avail)} ({share(avail, total)} of {format_bytes(total)}{where})"


def below_line(cause: str, have: str, line: int, setting: Threshold, rate: Optional[float]) -> str:
    falling = f", filling at {format_rate(rate)}" if rate else ""
    return (
        f"available memory {have} is below the {STEP_WORDS[cause]} threshold "
        f"{_th_text(line, setting)}{falling}"
    )


def just_above_line(have: str, warn: int, setting: Threshold, clears: int) -> str:
    return (
        f"available memory {have} is just above the warning threshold "
        f"{_th_text(warn, setting)}; the warning clears above {format_bytes(clears)}"
    )


def trend_line(rate: float, tte: float, park: int) -> str:
    return (
        f"memory is filling at {format_rate(rate)}: about {tte:.0f} s until available "
        f"memory reaches the park threshold {format_bytes(park)}"
    )


def psi_line(psi: float, threshold: float, seconds: float) -> str:
    return (
        f"memory pressure: all tasks stalled {psi:.0f}% of the last 10 s, above "
        f"{threshold:g}% for {seconds:.0f} s"
    )


def budget_line(label: str, vram: bool, used: int, limit: float, budget: int) -> str:
    """A job at (``used >= limit``) or near its RAM or VRAM budget; ``limit`` above
    ``budget`` when the budget was raised."""
    what = "VRAM" if vram else "RAM"
    if used >= limit:
        extra = " (raised when you resumed it)" if limit > budget else ""
        return (
            f"{label} uses {format_bytes(used)} of {what}, over its budget of "
            f"{format_bytes(limit)}{extra}"
        )
    return (
        f"{label} uses {format_bytes(used)} of {what}, {share(used, budget)} of its "
        f"budget of {format_bytes(budget)}"
    )


def no_checkpoint_line(label: str, rss: Optional[int]) -> str:
    return (
        f"{label} holds {format_bytes(rss)} but has no checkpoint folder: parking it "
        "would lose its progress, so it stays paused"
    )


def rule_line(name: str, pid: int, pattern: str, rss: int, rate: Optional[float]) -> str:
    grows = f", {format_rate(rate)}" if rate is not None else ""
    return f"{name} (pid {pid}, your rule {pattern!r}) holds {format_bytes(rss)}{grows}"


def gpu_holder(who: str, used: Optional[int]) -> str:
    """ "; job a1 (train.py) holds 3.0 GiB": who holds most of a GPU's memory."""
    return f"; {who} holds {format_bytes(used)}"


def gpu_line(g: GpuReading, used: int, total: int, holder: str) -> str:
    how_full = f"{share(used, total)} ({format_bytes(used)} of {format_bytes(total)})"
    if g.display_active:
        return (
            f"GPU {g.index} ({g.name}) drives the desktop and {how_full} of its memory "
            f"is used{holder}: the desktop may stall"
        )
    return f"GPU {g.index} ({g.name}): {how_full} of its memory is used{holder}"


# -- acts and notifications -------------------------------------------------------------------

_PAST: Mapping[str, str] = {
    A.PAUSE: "paused",
    A.RESUME: "resumed",
    A.PARK: "parking",
    A.STOP: "stopping",
}


def act_line(kind: str, label: str, reason: str, dry_run: bool) -> str:
    """The line for an act's event: "paused job x: why", or "would pause job x: why"."""
    if dry_run:
        return f"would {kind} {label}: {reason}"
    return f"{_PAST[kind]} {label}: {reason}"


def by_rule(reason: str, pattern: str) -> str:
    return f"{reason} (your rule {pattern!r})"


def park_line(reason: str) -> str:
    return f"{reason}; its checkpoint keeps the progress"


def went_over_line(label: str, vram: bool, budget: int) -> str:
    """A job paused for going over its budget, under it now (frozen below its peak)."""
    return f"{label} went over its budget of {format_bytes(budget)} of {'VRAM' if vram else 'RAM'}"


def smaller_line(reason: str, batch: Optional[int], accumulation: int) -> str:
    micro = f"{batch // accumulation} x {accumulation}" if batch else f"1/{accumulation}"
    return (
        f"{reason}; relaunched from its checkpoint at micro-batches of {micro} (the same training)"
    )


def stop_line(reason: str) -> str:
    return f"{reason}; nothing else is left to free memory"


def falling_line(trend_reason: str) -> str:
    return f"memory keeps falling with the guard's jobs paused ({trend_reason})"


def resume_line(resume: int, seconds: float, available: int, parked: bool) -> str:
    line = (
        f"available memory has stayed above {format_bytes(resume)} for {seconds:.0f} s "
        f"({format_bytes(available)} now)"
    )
    return line + "; relaunched from its checkpoint" if parked else line


def back_to_normal_line(available: int, total: int) -> str:
    return (
        f"memory is back to normal: {format_bytes(available)} available ({share(available, total)})"
    )


def held_line(
    label: str, how: str, parked: bool, by_hand: bool, relapses: int, need: int, resume_after: float
) -> str:
    """Why a job (or process) the guard paused or parked stays so, and what brings it back;
    ``how`` is what resumes it by hand."""
    what = "parked" if parked else "paused"
    if by_hand:
        if relapses:
            return (
                f"{label} is {what} by the guard; it was stopped again soon after "
                f"{relapses} automatic resumes, so resume it by hand ({how})"
            )
        return f"{label} is {what} by the guard; resume it by hand ({how})"
    verb = "is relaunched from its checkpoint" if parked else "resumes"
    return (
        f"{label} is {what} by the guard; it {verb} when available memory stays above "
        f"{format_bytes(need)} for {resume_after:g} s"
    )


def waits_line(label: str, more: int, free: int) -> str:
    """Why a job the guard suspended mid-step is not resumed yet: the step it is in needs
    more than there is."""
    return (
        f"{label} waits to resume: it needs about {format_bytes(more)} more and "
        f"{format_bytes(free)} is free"
    )


def resume_how(job_id: Optional[str], pid: Optional[int]) -> str:
    if job_id is not None:
        return f"'headroom resume {job_id}'"
    return f"kill -CONT {pid}" if pid is not None else "hand"


# -- checks before acting ---------------------------------------------------------------------


def gone_line(job_id: str) -> str:
    return f"job {job_id} is gone"


def state_line(label: str, state: str) -> str:
    return f"{label} is {state}"


def passed_line(kind: str, cause: str, available: int) -> str:
    if kind == A.RESUME:
        return "memory is short again"
    return f"on a fresh reading the cause ({cause}) has passed: {format_bytes(available)} available"


def failed_line(kind: str, label: str, why: str) -> str:
    return f"could not {kind} {label}: {why}"
