"""What the tray shows, worked out from the engine's status record: no Qt, no I/O.

The icon's state, the tooltip, the menu's entries and the notifications are pure functions of
the status (``engine.status_record.Status``) and of the events, so they are tested with
recorded statuses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from trayapp import formats, series, vocab
from trayapp.config import format_bytes
from trayapp.engine.event_record import EngineEvent
from trayapp.engine.status_record import Status
from trayapp.jobs.record import JobRecord
from trayapp.text import lines as escaped_lines
from trayapp.text import notice, one_line
from trayapp.vocab import EventKind as E
from trayapp.vocab import GuardAct as A
from trayapp.vocab import GuardLevel as L
from trayapp.vocab import JobState as S

# Fill levels of the icon's bars: 20 steps of 5%, so a few MiB more or less does not redraw it.
LEVELS = 20

GUARD_STATES = vocab.LEVELS
UNREACHABLE = "unreachable"

# Jobs in these states no longer run: nothing to guard, nothing to pause. (A parked job counts
# here: the tray's menu leaves it out and quitting does not ask about it.)
ENDED_STATES = vocab.ENDED | vocab.PARKED
# Actions the menu offers per job state (the engine has the last word).
_ACTIONS_RUNNING = (A.PAUSE, A.PARK, A.STOP)
_ACTIONS_PAUSED = (A.RESUME, A.PARK, A.STOP)
JOB_ACTIONS: Dict[str, Tuple[str, ...]] = {
    S.STARTING: (A.STOP,),
    S.RUNNING: _ACTIONS_RUNNING,
    S.PAUSING: (A.RESUME, A.STOP),
    S.PAUSED: _ACTIONS_PAUSED,
    S.PARKING: (A.STOP,),
    S.PARKED: (A.RESUME,),
}
# The dashboard's banner for the guard levels that have one.
BANNER_WORDS: Dict[str, str] = {L.WARN: "Warning", L.PAUSE: "Jobs paused", L.PARK: "Jobs parked"}
GUARD_MODES = ("act", "dry-run", "off")
GUARD_MODE_LABELS = {
    "act": "Act (warn, pause, park)",
    "dry-run": "Dry run (only record)",
    "off": "Off (watch only)",
}


INTERRUPT_TEXT = "Interrupt fit"  # a kernel's park


def is_active_job(job: JobRecord) -> bool:
    """Whether the job still runs (or is paused): quitting must ask what to do with it."""
    return job.state not in ENDED_STATES


def status_jobs(status: Optional[Status]) -> Tuple[JobRecord, ...]:
    """The jobs of a status (none without one)."""
    return status.jobs if status is not None else ()


def active_jobs(status: Optional[Status]) -> List[JobRecord]:
    return [j for j in status_jobs(status) if is_active_job(j)]


def is_demo(status: Optional[Status]) -> bool:
    """True when the engine runs on simulated GPUs (``--demo``)."""
    return status is not None and status.demo


# -- levels and the icon ------------------------------------------------------------------------


def quantise(fraction: Optional[float], levels: int = LEVELS) -> Optional[int]:
    """A fill fraction as one of ``levels + 1`` steps; None stays None (not known)."""
    if fraction is None or fraction != fraction:  # NaN is "not known" as well
        return None
    return max(0, min(levels, int(round(float(fraction) * levels))))


@dataclass(frozen=True)
class IconState:
    """Everything the tray icon shows; equal states draw the same pixels."""

    state: str = UNREACHABLE  # one of GUARD_STATES or UNREACHABLE
    ram_level: Optional[int] = None  # 0..LEVELS, None when not known
    vram_level: Optional[int] = None  # None: no GPU (or its memory is not known)


def guard_state(status: Optional[Status]) -> str:
    """The guard's state, or "unreachable" when there is no engine's answer."""
    if status is None or not status.engine.running:
        return UNREACHABLE
    state = status.guard.state
    return state if state in GUARD_STATES else L.OK


def icon_state(status: Optional[Status], reachable: bool = True) -> IconState:
    """The icon for a status. Unreachable keeps the last levels, drawn grey."""
    if status is None:
        return IconState()
    state = guard_state(status) if reachable else UNREACHABLE
    return IconState(state, quantise(status.ram_fraction), quantise(status.vram_fraction))


# -- text ----------------------------------------------------------------------------------------


# The formatters shared with the command line, under the names the UI imports.
format_duration = formats.duration
percent = formats.percent


def job_progress(job: JobRecord) -> str:
    """``"epoch 2/10, step 120/500"`` or "" when the job reports no progress."""
    return formats.progress(job.epoch, job.epochs, job.step, job.steps)


def job_label(job: JobRecord) -> str:
    """One line for a job in the menu: name, state and progress (escaped: the job named
    itself)."""
    text = f"{job.name or job.id or 'job'} — {job.state or 'unknown'}"
    progress = job_progress(job)
    return one_line(f"{text}, {progress}" if progress else text)


def guard_line(status: Status) -> str:
    """The guard's state and first reason, and when memory runs out if it is predicted (one
    line, escaped: a reason may name a job)."""
    guard = status.guard
    text = f"Guard: {guard.state_words()}"
    if guard.reasons:
        text += f" — {guard.reasons[0]}"
    runs_out = guard.runs_out()
    if runs_out:
        text += f"; {runs_out}"
    return one_line(text)


def tooltip_text(
    status: Optional[Status],
    reachable: bool = True,
    reason: Optional[str] = None,
    demo: bool = False,
) -> str:
    """The tray icon's tooltip: RAM, VRAM, the guard (state, reason, time left), the jobs;
    each line escaped as ``text.one_line`` does."""
    title = "Headroom"
    if demo or is_demo(status):
        title += " (simulated GPUs)"
    lines = [title]
    if not reachable or status is None:
        lines.append("Engine not reachable" + (f": {reason}" if reason else ""))
        if status is None:
            return escaped_lines("\n".join(lines))
        lines.append("Last known:")
    m = status.memory
    # The icon's two bars, said by name: the left one RAM, the right one the fullest GPU's.
    if m is None:
        lines.append("RAM (left bar) n/a")
    else:
        lines.append(
            f"RAM (left bar) {format_bytes(m.used_bytes)} used of {format_bytes(m.total_bytes)},"
            f" {format_bytes(m.available_bytes)} available"
        )
    if not status.gpus:
        lines.append(f"VRAM n/a ({status.gpu_status.message or 'no GPU'}; the right bar is empty)")
    shown = status.fullest_gpu
    for g in status.gpus:
        bar = " (right bar)" if g is shown else ""
        lines.append(
            f"GPU{g.index} VRAM{bar} {format_bytes(g.memory_used_bytes)}"
            f" of {format_bytes(g.memory_total_bytes)} "
            f"({percent(g.memory_used_bytes, g.memory_total_bytes)})"
        )
    if reachable:
        lines.append(guard_line(status))
    jobs = active_jobs(status)
    if jobs:
        lines.append(
            "Jobs: "
            + "; ".join(job_label(j) for j in jobs[:4])
            + (f" and {len(jobs) - 4} more" if len(jobs) > 4 else "")
        )
    else:
        lines.append("No jobs running")
    return escaped_lines("\n".join(lines))


# -- the menu ------------------------------------------------------------------------------------


@dataclass
class MenuEntry:
    """One menu line. ``key`` names what it does (``"job:<id>:pause"``, ``"guard:off"``...);
    a separator has kind "separator"; a submenu has ``children``."""

    text: str = ""
    key: str = ""
    kind: str = "action"  # action | separator | submenu | label
    enabled: bool = True
    checked: Optional[bool] = None  # None: not checkable
    children: List[MenuEntry] = field(default_factory=list)


def _sep() -> MenuEntry:
    return MenuEntry(kind="separator")


def menu_entries(status: Optional[Status], reachable: bool) -> List[MenuEntry]:
    """The tray menu for this status. With no engine, the engine's entries are disabled."""
    live = reachable and status is not None
    jobs = active_jobs(status) if live else []
    entries = [
        MenuEntry("Dashboard", "open:dashboard"),
        MenuEntry("Launch training...", "open:launch", enabled=live),
    ]
    job_menu = MenuEntry("Jobs", "jobs", kind="submenu", enabled=live)
    if not live:
        job_menu.children.append(MenuEntry("Engine not reachable", kind="label", enabled=False))
    elif not jobs:
        job_menu.children.append(MenuEntry("No jobs running", kind="label", enabled=False))
    for job in jobs:
        jid = job.id
        sub = MenuEntry(job_label(job), f"job:{jid}", kind="submenu")
        actions = JOB_ACTIONS.get(job.state, ())
        for action in (A.PAUSE, A.RESUME, A.PARK, A.STOP):
            enabled = action in actions
            text = action.capitalize()
            if action == A.PARK and job.is_kernel:  # a kernel's park interrupts its fit
                text, enabled = INTERRUPT_TEXT, enabled and job.kernel_in_fit
            sub.children.append(MenuEntry(text, f"job:{jid}:{action}", enabled=enabled))
        job_menu.children.append(sub)
    job_menu.children += [_sep(), MenuEntry("All jobs...", "open:jobs", enabled=live)]
    entries.append(job_menu)
    entries.append(
        MenuEntry(
            "Pause all jobs",
            "pause_all",
            enabled=live and any(A.PAUSE in JOB_ACTIONS.get(j.state, ()) for j in jobs),
        )
    )
    mode = status.guard.mode if live and status is not None else None
    guard = MenuEntry("Guard", "guard", kind="submenu", enabled=live)
    for m in GUARD_MODES:
        guard.children.append(MenuEntry(GUARD_MODE_LABELS[m], f"guard:{m}", checked=mode == m))
    # The Machines window asks Prometheus, not the engine: it opens without one.
    entries += [
        guard,
        _sep(),
        MenuEntry("Machines...", "open:machines"),
        MenuEntry("Settings...", "open:settings", enabled=live),
        _sep(),
        MenuEntry("Quit", "quit"),
    ]
    return entries


# -- notifications -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Notice:
    title: str
    message: str  # plain text, markup escaped (``text.notice``): daemons may render markup
    level: str  # info | warn | error


_NOTIFY_TITLES: Dict[str, str] = {
    E.GUARD_WARN: "Memory is running low",
    E.GUARD_PAUSE: "Jobs paused: memory is running out",
    E.GUARD_PARK: "Job parked to free memory",
    E.JOB_SHRUNK: "Training shrunk to fit",
    E.JOB_FINISHED: "Training finished",
    E.JOB_FAILED: "Training failed",
    E.CONFIG_PROBLEM: "A problem in the settings file",
}


def notice_for(event: EngineEvent) -> Optional[Notice]:
    """The desktop notification for an event, or None for kinds that do not notify. Its
    message is the event's, escaped for a notification (``text.notice``): it may hold a job's
    name or its note."""
    kind = event.kind
    title = _NOTIFY_TITLES.get(kind)
    if title is None:
        return None
    level = str(
        event.level
        or (
            "error"
            if kind in (E.JOB_FAILED, E.GUARD_PARK)
            else "warn"
            if kind.startswith("guard_")
            else "info"
        )
    )
    return Notice(title, notice(event.text), level)


def banner_text(
    status: Optional[Status], reachable: bool, reason: Optional[str] = None
) -> Tuple[str, str]:
    """The dashboard's banner: (level, text); level "" means no banner. An active warning is
    always shown here, since desktop notifications can be suppressed. The text is one line,
    escaped: the guard's reasons name jobs and processes."""
    if not reachable:
        return "unreachable", one_line(
            "The engine is not reachable"
            + (f": {reason}" if reason else "")
            + ". Nothing is guarding your jobs until it is back; Headroom keeps trying."
        )
    if status is None:
        return "", ""
    guard = status.guard
    state = guard.state
    if state not in BANNER_WORDS:
        if guard.mode == "off":
            return "info", "The guard is off: Headroom only watches."
        return "", ""
    text = BANNER_WORDS[state] + ": " + ("; ".join(guard.reasons) or "memory is running low")
    runs_out = guard.runs_out()
    if runs_out:
        text += f". M{runs_out[1:]}"
    if guard.mode == "dry-run":
        text += " (dry run: the guard records and does nothing)"
    return state, one_line(text)


# -- VRAM per process ----------------------------------------------------------------------------


def vram_split(status: Status) -> Dict[int, Dict[str, float]]:
    """Per GPU index, VRAM by the guard's jobs (``"job.<id>"``) and the rest (``"other"``),
    as the engine splits it for the history (``trayapp.series``)."""
    owners = series.pid_owners(status.jobs)
    return {g.index: series.vram_layers(g, owners) for g in status.gpus}


def job_names(status: Optional[Status]) -> Dict[str, str]:
    """Job id -> name (escaped), for the legend of the VRAM stack and the markers."""
    return {j.id: one_line(j.name or j.id) for j in status_jobs(status)}


def clock_text(t: float) -> str:
    return formats.clock(t)
