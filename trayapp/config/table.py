"""The table of settings: each one's section, key, default, check, comment, limits, and the
label and unit the settings window shows. Adding a setting is one entry in ``SETTINGS``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

from trayapp.config.net import as_listen, as_path_text, as_url
from trayapp.config.sizes import ConfigError, Threshold, _shown
from trayapp.vocab import GuardAct, GuardMode


def _as_float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"{_shown(v)} is not a number")
    try:
        f = float(v)
    except OverflowError:
        f = math.inf
    if not math.isfinite(f):
        raise ConfigError(f"{_shown(v)} is not a finite number")
    return f


def _as_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{_shown(v)} is not a whole number")
    return v


def _as_bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{_shown(v)} is not true or false")
    return v


def _as_threshold(v: Any) -> Any:
    t = Threshold.parse(v)
    # A bare number is a size in bytes; keep it a number so it reads back the same.
    return v if isinstance(v, str) else t.size_bytes


class _Choice:
    """The check of a setting that is one of a few words (``options``)."""

    def __init__(self, *options: str):
        self.options = options

    def __call__(self, v: Any) -> str:
        if not isinstance(v, str) or v not in self.options:
            raise ConfigError(f"{_shown(v)} is not one of {', '.join(self.options)}")
        return str(v)


@dataclass(frozen=True)
class Setting:
    """One setting: where it goes in config.toml, its default and check, the comment written
    above it, and how the settings window shows it (``label``; ``unit`` after a number)."""

    section: str
    key: str
    default: Any
    convert: Callable[[Any], Any]
    comment: str
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    label: str = ""
    unit: str = ""

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}"

    @property
    def kind(self) -> str:
        """What kind of value it holds: "bool", "choice" (one of ``choices``), "threshold" (a
        share or a size), "number" or "text"."""
        if isinstance(self.default, bool):
            return "bool"
        if self.convert is _as_threshold:
            return "threshold"
        if self.choices:
            return "choice"
        if isinstance(self.default, str):
            return "text"
        return "number"

    @property
    def choices(self) -> Tuple[str, ...]:
        """The words a "choice" setting may be; () for any other."""
        return self.convert.options if isinstance(self.convert, _Choice) else ()

    def check(self, value: Any) -> Any:
        try:
            v = self.convert(value)
        except ConfigError:
            raise
        except (ArithmeticError, ValueError, TypeError, RecursionError):
            # A converter that meets a value it was not written for refuses it, never raises.
            raise ConfigError(f"{_shown(value)} cannot be used here") from None
        if self.minimum is not None and v < self.minimum:
            raise ConfigError(f"{_shown(value)} is below the minimum {self.minimum:g}")
        if self.maximum is not None and v > self.maximum:
            raise ConfigError(f"{_shown(value)} is above the maximum {self.maximum:g}")
        return v


SETTINGS: Tuple[Setting, ...] = (
    # [engine]
    Setting(
        "engine",
        "sample_interval",
        1.0,
        _as_float,
        "Seconds between samples while memory is calm; the guard samples faster (down to "
        "0.02 s) as headroom shrinks.",
        0.02,
        60,
        label="Sampling interval",
        unit="s",
    ),
    Setting(
        "engine",
        "idle_exit_seconds",
        60.0,
        _as_float,
        "Without --stay, the engine exits after this long with no clients and no jobs.",
        1,
        86400,
        label="Engine exits when idle for",
        unit="s",
    ),
    Setting(
        "engine",
        "publish_hz",
        4.0,
        _as_float,
        "Most snapshots a second sent to the tray and other subscribers.",
        0.1,
        10,
        label="Updates a second to the tray",
        unit="per s",
    ),
    # [history]
    Setting(
        "history",
        "raw_hours",
        24.0,
        _as_float,
        "Hours of every sample kept (at most one a second).",
        1,
        24 * 7,
        label="Keep every sample for",
        unit="h",
    ),
    Setting(
        "history",
        "keep_days",
        30.0,
        _as_float,
        "Days of one-minute min/mean/max kept.",
        1,
        3650,
        label="Keep one-minute history for",
        unit="days",
    ),
    # [guard]
    Setting(
        "guard",
        "mode",
        GuardMode.ACT.value,
        _Choice(*(m.value for m in GuardMode)),
        "act: warn, pause and park jobs; dry-run: record what it would do and do nothing; "
        "off: watch only.",
        label="Guard mode",
    ),
    Setting(
        "guard",
        "warn_available",
        "15%",
        _as_threshold,
        'Warn when available memory falls below this (a share like "15%" or a size like "2 GiB").',
        label="Warn below",
    ),
    Setting(
        "guard",
        "pause_available",
        "8%",
        _as_threshold,
        "Pause the guard's jobs when available memory falls below this.",
        label="Pause jobs below",
    ),
    Setting(
        "guard",
        "park_available",
        "5%",
        _as_threshold,
        "Park (checkpoint and end) a job when available memory falls below this.",
        label="Park a job below",
    ),
    Setting(
        "guard",
        "resume_available",
        "20%",
        _as_threshold,
        "Resume paused jobs when available memory is back above this.",
        label="Resume above",
    ),
    Setting(
        "guard",
        "warn_horizon_seconds",
        60.0,
        _as_float,
        "Warn when memory is predicted to run out within this many seconds.",
        0,
        3600,
        label="Warn when memory runs out within",
        unit="s",
    ),
    Setting(
        "guard",
        "pause_horizon_seconds",
        10.0,
        _as_float,
        "Pause when memory is predicted to run out within this many seconds.",
        0,
        3600,
        label="Pause when memory runs out within",
        unit="s",
    ),
    Setting(
        "guard",
        "psi_full_threshold",
        20.0,
        _as_float,
        'Memory pressure: warn when PSI "full avg10" (percent of time all tasks stall on '
        "memory) stays above this...",
        0,
        100,
        label="Warn when pressure (PSI full) is above",
        unit="%",
    ),
    Setting(
        "guard",
        "psi_duration_seconds",
        20.0,
        _as_float,
        "...for this many seconds.",
        0,
        3600,
        label="Warn for pressure after",
        unit="s",
    ),
    Setting(
        "guard",
        "vram_warn_percent",
        95.0,
        _as_float,
        "Warn when a GPU's memory use passes this percentage.",
        1,
        100,
        label="Warn when a GPU's memory is above",
        unit="%",
    ),
    Setting(
        "guard",
        "budget_warn_percent",
        90.0,
        _as_float,
        "Warn when a job reaches this share of its RAM or VRAM budget (pause at 100%).",
        1,
        100,
        label="Warn at this share of a job's budget",
        unit="%",
    ),
    Setting(
        "guard",
        "pause_deadline_seconds",
        2.0,
        _as_float,
        "How long a Keras job gets to pause at a batch end before it is suspended.",
        0.05,
        60,
        label="Time a job gets to pause by itself",
        unit="s",
    ),
    Setting(
        "guard",
        "auto_resume",
        True,
        _as_bool,
        "Resume paused jobs by itself when memory is back (per job, overridable).",
        label="Resume paused jobs when memory is back",
    ),
    Setting(
        "guard",
        "resume_after_seconds",
        10.0,
        _as_float,
        "Memory must stay above resume_available this long before an automatic resume.",
        0,
        3600,
        label="Memory must stay above “resume” for",
        unit="s",
    ),
    Setting(
        "guard",
        "cooldown_seconds",
        30.0,
        _as_float,
        "After an automatic resume, wait this long before pausing the same job again "
        "for a predicted (not actual) shortage.",
        0,
        3600,
        label="No predicted-shortage pause after a resume for",
        unit="s",
    ),
    Setting(
        "guard",
        "stop_available",
        "2%",
        _as_threshold,
        "Last resort: stop a job (gracefully, then forced) when available memory falls "
        "below this and no job is left to pause or park.",
        label="Stop a job below (last resort)",
    ),
    Setting(
        "guard",
        "hysteresis",
        "2%",
        _as_threshold,
        "A low-memory warning clears only once available memory is this far back above "
        "the warning threshold, so a reading that hovers at it does not flap.",
        label="Warning clears this far above",
    ),
    Setting(
        "guard",
        "psi_pause_threshold",
        60.0,
        _as_float,
        'Memory pressure: pause the guard\'s jobs when PSI "full avg10" stays above this '
        "(systemd-oomd acts at 60% for 30 s; 100 turns it off)...",
        0,
        100,
        label="Pause when pressure (PSI full) is above",
        unit="%",
    ),
    Setting(
        "guard",
        "psi_pause_duration_seconds",
        30.0,
        _as_float,
        "...for this many seconds.",
        0,
        3600,
        label="Pause for pressure after",
        unit="s",
    ),
    Setting(
        "guard",
        "rate_window_seconds",
        3.0,
        _as_float,
        "Seconds of recent samples the fill rate is fitted to (least squares): longer is "
        "steadier, shorter notices a change sooner.",
        0.5,
        60,
        label="Fill rate measured over",
        unit="s",
    ),
    Setting(
        "guard",
        "kernel_brake",
        True,
        _as_bool,
        "Put each job in a memory cgroup of its own whose limit follows what it may have "
        "(its RAM budget, what the machine can give): the kernel holds it there instead of "
        "the OOM killer ending it (Linux, cgroup v1 writable; elsewhere the guard alone).",
        label="Hold jobs at their limit in the kernel (cgroups)",
    ),
    # [jobs]
    Setting(
        "jobs",
        "nice",
        0,
        _as_int,
        "CPU priority of a job, as a nice value from 0 (the desktop's normal priority) to "
        "19 (the nicest): a job never runs above the desktop (Windows: above 0 is the "
        "below-normal priority class).",
        0,
        19,
        label="Jobs' CPU priority (nice, 0 = the desktop's)",
    ),
    Setting(
        "jobs",
        "oom_score_adj",
        500,
        _as_int,
        "How readily the kernel's OOM killer picks a job, from 0 (like the desktop) to "
        "1000 (first): if the kernel must kill, it takes the training, which a checkpoint "
        "brings back, and not the desktop (Linux only).",
        0,
        1000,
        label="Jobs' OOM score (the kernel kills higher first)",
    ),
    Setting(
        "jobs",
        "log_max_mb",
        32,
        _as_int,
        "Most MiB of output a job's log keeps: past it, the first eighth and the last half "
        "are kept, with a line saying how much was dropped between them.",
        1,
        1024 * 1024,
        label="Keep at most this much of a job's output",
        unit="MiB",
    ),
    # [metrics]
    Setting(
        "metrics",
        "listen",
        "",
        as_listen,
        'Serve Prometheus metrics at http://ADDRESS:PORT/metrics: "9835" listens on this '
        'machine only (127.0.0.1), "0.0.0.0:9835" on every network (logged with a '
        "warning; use TLS). Empty: off, nothing listens. `headroom engine --metrics` "
        "overrides it.",
        label="Serve Prometheus metrics at (empty: off)",
    ),
    Setting(
        "metrics",
        "tls_cert",
        "",
        as_path_text,
        "Certificate file (PEM) for serving the metrics over HTTPS; needs tls_key too.",
        label="Metrics TLS certificate file",
    ),
    Setting(
        "metrics",
        "tls_key",
        "",
        as_path_text,
        "Private key file (PEM) of that certificate.",
        label="Metrics TLS key file",
    ),
    # [machines]
    Setting(
        "machines",
        "prometheus",
        "",
        as_url,
        "URL of a Prometheus server that scrapes the Headroom engines of your machines "
        '(e.g. "http://prometheus.lab:9090"); the Machines window asks it. Empty: off.',
        label="Prometheus server for the Machines window",
    ),
    Setting(
        "machines",
        "refresh_seconds",
        5.0,
        _as_float,
        "Seconds between the Machines window's queries to Prometheus.",
        1,
        3600,
        label="Refresh the Machines window every",
        unit="s",
    ),
    # [ui]
    Setting(
        "ui",
        "notifications",
        True,
        _as_bool,
        "Show desktop notifications.",
        label="Show desktop notifications",
    ),
    Setting(
        "ui",
        "show_dashboard_at_start",
        False,
        _as_bool,
        "Open the dashboard when Headroom starts (otherwise only the tray icon).",
        label="Open the dashboard when Headroom starts",
    ),
    Setting(
        "ui",
        "start_at_login",
        False,
        _as_bool,
        "Start Headroom when you log in.",
        label="Start Headroom when I log in",
    ),
)

SETTINGS_BY_NAME: Dict[str, Setting] = {s.name: s for s in SETTINGS}
SECTIONS = tuple(dict.fromkeys(s.section for s in SETTINGS))
# The guard's settings by key (the attributes of the guard's Policy).
GUARD_SETTINGS: Dict[str, Setting] = {s.key: s for s in SETTINGS if s.section == "guard"}
# What a [[guard.rules]] entry may do to the processes it names.
RULE_ACTS = (GuardAct.WARN.value, GuardAct.PAUSE.value, GuardAct.STOP.value)
# Sections holding lists or tables the flat table above does not describe.
FREE_FORM = {("guard", "rules")}
