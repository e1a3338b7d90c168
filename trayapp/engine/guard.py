"""The guard's decisions: readings, their recent history and the policy in; actions out.

Nothing here reads the machine or touches a process (``GuardService`` in ``guarding.py`` does
both), so every rule is tested with tables of readings.

The ladder, for available memory (cgroup-aware) and for each job's budgets:

* warn: below ``warn_available``, or exhaustion predicted within ``warn_horizon_seconds``,
  or PSI "full avg10" above its threshold for its duration, or a job at 90% of a budget, or a
  GPU's memory past ``vram_warn_percent``.
* pause: below ``pause_available``, or exhaustion predicted within ``pause_horizon_seconds``,
  or PSI above the pause threshold for its duration, or a job at its budget.
* park: below ``park_available`` (a paused job with a checkpoint folder is parked), or memory
  still falling with the guard's jobs paused.
* stop: below ``stop_available`` when nothing else is left to do.

Exhaustion means available memory reaching the *park* threshold: past it the guard must end a
job, so "seconds to exhaustion" is the time left to act without losing anything. It is
predicted from the fill rate, a least-squares slope over the last ``rate_window_seconds`` of
samples (at least three), counted only when the fit is clear of its own noise.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import (
    Any,
    Callable,
    Deque,
    Dict,
    FrozenSet,
    Iterable,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Tuple,
)

from trayapp import vocab
from trayapp.config import GUARD_SETTINGS, Setting, Threshold, format_bytes
from trayapp.probes.snapshot import GpuReading, MemoryReading
from trayapp.vocab import GuardAct as A
from trayapp.vocab import GuardCause as C
from trayapp.vocab import GuardLevel as L
from trayapp.vocab import GuardMode as M
from trayapp.vocab import JobState as S

LEVELS = vocab.LEVELS
_RANK = vocab.RANK

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
# A predicted shortage that only warns must last this long (a job importing TensorFlow fills
# memory fast for a second or two, then stops).
TREND_HOLD_SECONDS = 2.0
# A warning that cleared is not announced again unless it stays away this long.
ANNOUNCE_HOLD_SECONDS = 30.0
# An action on a target blocks further actions on it until its state changes, or this long.
PENDING_SECONDS = 3.0
# A job paused again soon after this many automatic resumes is left for the user to resume.
MAX_RELAPSES = 3
# GPUs are read every tick (not once a second) within this many points of the VRAM warning,
# and while a job is past this share of its VRAM budget.
VRAM_NEAR_POINTS = 5.0
VRAM_BUDGET_NEAR_SHARE = 0.8

RUNNING_STATES = vocab.RUNNING
PAUSED_STATES = vocab.PAUSED
PARKED_STATES = vocab.PARKED
ENDED_STATES = vocab.ENDED

# A sample this much older than the last one means the wall clock was set back.
CLOCK_STEP_SECONDS = 1.0
MEM = "mem"  # history series: minus available memory, so a positive slope means filling


# -- what a condition is about -------------------------------------------------------------


class Watch(str, Enum):
    """What a condition is about: one kind of thing the guard watches."""

    MEM = "mem"  # available memory against the ladder's thresholds
    TREND = "trend"  # the fill rate's prediction
    PSI = "psi"  # memory pressure
    RAM = "ram"  # a job's RAM budget
    VRAM = "vram"  # a job's VRAM budget
    GPU = "gpu"  # a GPU's memory
    NOCKPT = "nockpt"  # a paused job that cannot be parked
    RULE = "rule"  # a process a user rule names


# Machine-wide memory conditions (they name the largest processes); a job's own budgets.
MEMORY_WATCHES = frozenset({Watch.MEM, Watch.TREND, Watch.PSI})
BUDGET_WATCHES = frozenset({Watch.RAM, Watch.VRAM})


class CondKey(NamedTuple):
    """One thing watched: what (``watch``) and which (a job id, a GPU index, a pid)."""

    watch: Watch
    ref: Optional[str] = None


MEM_KEY = CondKey(Watch.MEM)
TREND_KEY = CondKey(Watch.TREND)
PSI_KEY = CondKey(Watch.PSI)


# -- inputs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A user rule for processes Headroom did not start: fnmatch ``pattern`` on the name."""

    pattern: str
    action: str  # a GuardAct: warn, pause or stop


def _policy_value(s: Setting, value: Any) -> Any:
    """A setting's value as the decision uses it: a threshold as a Threshold, a number as a
    float."""
    kind = s.kind
    if kind == "threshold":
        return value if isinstance(value, Threshold) else Threshold.parse(value)
    if kind == "number":
        return float(value)
    if kind == "bool":
        return bool(value)
    return str(value)


_DEFAULTS: Mapping[str, Any] = {k: _policy_value(s, s.default) for k, s in GUARD_SETTINGS.items()}


class Policy:
    """The guard's settings (section ``[guard]`` of config.toml) as the decision uses them:
    one attribute per guard setting of ``config.SETTINGS``, named by its key there and
    defaulting to its default there (thresholds as ``Threshold``, numbers as floats), and the
    user's ``rules``. Immutable; two policies with the same values are equal.

    ``Policy(mode="dry-run", warn_available=Threshold(percent=10))``: the defaults, but those.
    """

    rules: Tuple[Rule, ...]

    def __init__(self, rules: Iterable[Rule] = (), **values: Any) -> None:
        unknown = sorted(set(values) - set(GUARD_SETTINGS))
        if unknown:
            raise TypeError(f"not a guard setting: {', '.join(unknown)}")
        own = self.__dict__  # plain attributes: the decision reads them many times a tick
        own.update(_DEFAULTS)
        for key, value in values.items():
            own[key] = _policy_value(GUARD_SETTINGS[key], value)
        own["rules"] = tuple(rules)

    def __getattr__(self, name: str) -> Any:
        # Only reached for a name that is not a setting (every setting is set in __init__);
        # declared so that each setting reads as an attribute where the guard uses it.
        raise AttributeError(f"the guard has no setting {name}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Policy does not change; make a new one")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Policy) and self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, v) for k, v in self.__dict__.items())))

    def __repr__(self) -> str:
        changed = [f"{k}={v!r}" for k, v in self.__dict__.items()
                   if k == "rules" and v or k != "rules" and v != _DEFAULTS[k]]
        return f"Policy({', '.join(changed)})"

    @classmethod
    def from_config(cls, config: Any) -> Policy:
        """The policy from a loaded ``trayapp.config.Config`` (values already validated)."""
        return cls(rules=(Rule(str(r["process"]), str(r.get("action", A.WARN)))
                          for r in getattr(config, "rules", ()) or ()),
                   **{key: config[s.name] for key, s in GUARD_SETTINGS.items()})


@dataclass(frozen=True)
class JobView:
    """One of the guard's jobs as the decision sees it."""

    id: str
    name: str
    state: str
    pids: Tuple[int, ...] = ()
    rss_bytes: Optional[int] = None
    vram_bytes: Optional[int] = None
    hooked: bool = False  # the Keras fit hook is in: it can pause at a batch end
    checkpoint: bool = False  # it has a checkpoint folder: parking keeps its progress
    ram_budget_bytes: Optional[int] = None
    vram_budget_bytes: Optional[int] = None
    paused_by: Optional[str] = None  # "guard" | "user" | None
    auto_resume: Optional[bool] = None  # None: the policy's auto_resume
    parked_by: Optional[str] = None  # who parked it, while it is parked

    @property
    def label(self) -> str:
        return f"job {self.id} ({self.name})" if self.name else f"job {self.id}"

    def budget(self, watch: Watch) -> Tuple[Optional[int], Optional[int]]:
        """(what it uses, its budget) of RAM or of VRAM."""
        if watch is Watch.RAM:
            return self.rss_bytes, self.ram_budget_bytes
        return self.vram_bytes, self.vram_budget_bytes


@dataclass(frozen=True)
class ProcessView:
    """A process Headroom did not start (or one of a job's), from the top-RSS sample."""

    pid: int
    name: str
    rss_bytes: int
    rate_bytes_per_s: Optional[float] = None  # RSS growth since the previous sample
    job_id: Optional[str] = None  # set when the process belongs to one of the guard's jobs
    rule: Optional[Rule] = None  # the first user rule naming it
    paused_by_guard: bool = False

    @property
    def label(self) -> str:
        return f"process {self.name} (pid {self.pid})"


@dataclass(frozen=True)
class GuardInput:
    """One tick's readings: memory, GPUs, the guard's jobs and (when sampled) top processes."""

    time: float
    memory: MemoryReading
    gpus: Tuple[GpuReading, ...] = ()
    jobs: Tuple[JobView, ...] = ()
    processes: Tuple[ProcessView, ...] = ()
    gpus_fresh: bool = True  # the GPU readings were taken this tick


# -- history and the fill rate ----------------------------------------------------------------


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

    def fit(self, name: str, now: float, window: float,
            since: Optional[float] = None) -> Optional[Fit]:
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
    significant = (n >= MIN_FIT_SAMPLES and abs(slope) >= NOISE_RATE_BYTES_PER_S
                   and abs(slope) * span > 2.0 * scatter)
    return Fit(slope, n, span, significant, last_step)


# -- thresholds and conditions ----------------------------------------------------------------


# The guard setting of each threshold -> its field in Thresholds.
_THRESHOLD_OF = {"warn_available": "warn", "pause_available": "pause",
                 "park_available": "park", "stop_available": "stop",
                 "resume_available": "resume", "hysteresis": "hysteresis"}


@dataclass(frozen=True)
class Thresholds:
    """The policy's thresholds in bytes for one total."""

    warn: int
    pause: int
    park: int
    stop: int
    resume: int
    hysteresis: int

    @classmethod
    def of(cls, policy: Policy, total_bytes: int) -> Thresholds:
        return cls(
            warn=policy.warn_available.bytes_of(total_bytes),
            pause=policy.pause_available.bytes_of(total_bytes),
            park=policy.park_available.bytes_of(total_bytes),
            stop=policy.stop_available.bytes_of(total_bytes),
            resume=policy.resume_available.bytes_of(total_bytes),
            hysteresis=policy.hysteresis.bytes_of(total_bytes),
        )

    def to_json(self) -> Dict[str, int]:
        return {f"{k}_bytes": getattr(self, k)
                for k in ("warn", "pause", "park", "stop", "resume")}

    def at(self, setting: str) -> int:
        """The bytes of the threshold setting ``setting`` names (``pause_available``...)."""
        return int(getattr(self, _THRESHOLD_OF[setting]))

    def below(self, available: int) -> int:
        """The nearest threshold under ``available`` (0 when it is under all of them)."""
        under = [x for x in (self.warn, self.pause, self.park, self.stop) if x < available]
        return max(under) if under else 0


@dataclass(frozen=True)
class Condition:
    """Something the guard sees now: a key (one per thing watched), a level and a line."""

    key: CondKey
    level: str  # a GuardLevel: the cause's (``CAUSES``)
    cause: str  # what acting on it means; checked again on a fresh reading before acting
    reason: str
    job_id: Optional[str] = None


@dataclass(frozen=True)
class Assessment:
    """What the readings mean before any choice: thresholds, fill rate, conditions."""

    thresholds: Thresholds
    available_bytes: int
    fill_rate_bytes_per_s: Optional[float]  # significant rate only; positive = filling
    seconds_to_exhaustion: Optional[float]
    conditions: Tuple[Condition, ...]
    job_rates: Dict[str, float]  # job id -> RSS growth, bytes/s (0 when noise)
    psi_warn_since: Optional[float]
    psi_pause_since: Optional[float]
    trend_since: Optional[float]

    def condition(self, key: CondKey) -> Optional[Condition]:
        for c in self.conditions:
            if c.key == key:
                return c
        return None

    def causes(self) -> FrozenSet[Tuple[str, Optional[str]]]:
        return frozenset((c.cause, c.job_id) for c in self.conditions)


# -- state carried between decisions ----------------------------------------------------------


@dataclass(frozen=True)
class GuardState:
    """What the guard remembers between ticks. Treated as immutable: every change is a copy."""

    level: str = L.OK.value
    psi_warn_since: Optional[float] = None
    psi_pause_since: Optional[float] = None
    trend_since: Optional[float] = None
    calm_since: Optional[float] = None
    rate_since: Optional[float] = None  # fill rates are fitted to samples from here on
    announced: Dict[CondKey, Tuple[int, float]] = field(default_factory=dict)  # -> (rank, t)
    ok_pending: bool = False  # something was announced; say so when all is well again
    pending: Dict[str, Tuple[str, float, str]] = field(default_factory=dict)  # target ->
    # (action kind, time, target state then)
    resumed_at: Dict[str, float] = field(default_factory=dict)  # target -> automatic resume
    relapses: Dict[str, int] = field(default_factory=dict)
    paused_for: Dict[str, str] = field(default_factory=dict)  # target -> cause of its pause
    grace: Dict[CondKey, float] = field(default_factory=dict)  # a job's budget -> raised to
    parked_size: Dict[str, int] = field(default_factory=dict)  # target -> RSS when parked
    job_states: Dict[str, Tuple[str, Optional[str]]] = field(default_factory=dict)
    would: FrozenSet[str] = frozenset()  # dry-run: actions already reported
    keys: FrozenSet[CondKey] = frozenset()  # the condition keys of the last decision
    last_action: Optional[Dict[str, Any]] = None


# -- outputs ----------------------------------------------------------------------------------

_PAST: Mapping[str, str] = {A.PAUSE: "paused", A.RESUME: "resumed", A.PARK: "parking",
                            A.STOP: "stopping"}
EVENT_KINDS = vocab.GUARD_EVENTS


@dataclass(frozen=True)
class Action:
    """One thing to do: a notification (``warn``, ``ok``) or an act on a job or process."""

    kind: str  # a GuardAct: a notification (warn, ok) or an act
    reason: str
    cause: str = ""
    job_id: Optional[str] = None
    pid: Optional[int] = None
    label: str = ""
    deadline_seconds: Optional[float] = None  # pause: how long a cooperative pause may take
    dry_run: bool = False
    key: str = ""  # "<kind>:<target>" for acts
    target_state: str = ""
    data: Dict[str, Any] = field(default_factory=dict)
    condition: Optional[CondKey] = None  # a notification: the condition it announces

    @property
    def target(self) -> Optional[str]:
        if self.job_id is not None and self.kind in vocab.ACTS:
            return f"job:{self.job_id}"
        if self.pid is not None:
            return f"pid:{self.pid}"
        return None

    @property
    def acts(self) -> bool:
        return self.kind in vocab.ACTS

    @property
    def event_kind(self) -> str:
        return EVENT_KINDS[self.kind]

    @property
    def event_level(self) -> str:
        if self.dry_run or self.kind in (A.OK, A.RESUME):
            return "info"
        return "error" if self.kind == A.STOP else "warn"

    @property
    def message(self) -> str:
        """The line for the event: "paused job x: why", or "would pause job x: why"."""
        if not self.acts:
            return self.reason
        if self.dry_run:
            return f"would {self.kind} {self.label}: {self.reason}"
        return f"{_PAST[self.kind]} {self.label}: {self.reason}"


@dataclass(frozen=True)
class Decision:
    """The outcome of one tick: the level (``state``), why, the prediction, what to do."""

    state: str  # a GuardLevel
    reasons: Tuple[str, ...]
    seconds_to_exhaustion: Optional[float]
    fill_rate_bytes_per_s: Optional[float]
    thresholds: Thresholds
    actions: Tuple[Action, ...]
    next: GuardState
    wants_processes: bool = False  # a top-RSS sample would make the warning name names


# -- formatting -------------------------------------------------------------------------------


def format_rate(rate: Optional[float]) -> str:
    """``+300.0 MiB/s``; "n/a" for None."""
    if rate is None:
        return "n/a"
    return ("+" if rate >= 0 else "-") + format_bytes(abs(rate)) + "/s"


def _share(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.0f}%" if whole else "n/a"


def _th_text(value: int, setting: Threshold) -> str:
    if setting.percent is not None:
        return f"{format_bytes(value)} ({setting})"
    return format_bytes(value)


def top_text(processes: Iterable[ProcessView], jobs: Iterable[JobView], limit: int = 3) -> str:
    """"largest: firefox 3.1 GiB (+300.0 MiB/s), job a1 (train.py) 2.0 GiB", or ""."""
    names = {j.id: j.label for j in jobs}
    rows = sorted(processes, key=lambda p: p.rss_bytes, reverse=True)[:limit]
    parts = []
    for p in rows:
        who = names.get(p.job_id, p.name) if p.job_id else p.name
        rate = ""
        if p.rate_bytes_per_s is not None and abs(p.rate_bytes_per_s) >= NOISE_RATE_BYTES_PER_S:
            rate = f" ({format_rate(p.rate_bytes_per_s)})"
        parts.append(f"{who} {format_bytes(p.rss_bytes)}{rate}")
    return "largest: " + ", ".join(parts) if parts else ""


# The memory ladder's steps, as its sentences name them.
STEP_WORDS: Mapping[str, str] = {C.MEM_STOP: "last-resort", C.MEM_PARK: "park",
                                 C.MEM_PAUSE: "pause", C.MEM_WARN: "warning"}


def memory_have(avail: int, total: int, limit_source: str) -> str:
    """"1.1 GiB (7% of 16.0 GiB)", with "(cgroup limit)" when the total is a cgroup's."""
    where = " (cgroup limit)" if limit_source == "cgroup" else ""
    return f"{format_bytes(avail)} ({_share(avail, total)} of {format_bytes(total)}{where})"


def below_line(cause: str, have: str, line: int, setting: Threshold,
               rate: Optional[float]) -> str:
    falling = f", filling at {format_rate(rate)}" if rate else ""
    return f"available memory {have} is below the {STEP_WORDS[cause]} threshold " \
           f"{_th_text(line, setting)}{falling}"


def just_above_line(have: str, warn: int, setting: Threshold, clears: int) -> str:
    return f"available memory {have} is just above the warning threshold " \
           f"{_th_text(warn, setting)}; the warning clears above {format_bytes(clears)}"


def trend_line(rate: float, tte: float, park: int) -> str:
    return f"memory is filling at {format_rate(rate)}: about {tte:.0f} s until available " \
           f"memory reaches the park threshold {format_bytes(park)}"


def psi_line(psi: float, threshold: float, seconds: float) -> str:
    return f"memory pressure: all tasks stalled {psi:.0f}% of the last 10 s, above " \
           f"{threshold:g}% for {seconds:.0f} s"


def budget_line(job: JobView, watch: Watch, used: int, limit: float, budget: int) -> str:
    what = "RAM" if watch is Watch.RAM else "VRAM"
    if used >= limit:
        extra = " (raised when you resumed it)" if limit > budget else ""
        return f"{job.label} uses {format_bytes(used)} of {what}, over its budget of " \
               f"{format_bytes(limit)}{extra}"
    return f"{job.label} uses {format_bytes(used)} of {what}, {_share(used, budget)} of its " \
           f"budget of {format_bytes(budget)}"


def no_checkpoint_line(job: JobView) -> str:
    return f"{job.label} holds {format_bytes(job.rss_bytes)} but has no checkpoint folder: " \
           "parking it would lose its progress, so it stays paused"


def rule_line(p: ProcessView) -> str:
    assert p.rule is not None
    rate = f", {format_rate(p.rate_bytes_per_s)}" if p.rate_bytes_per_s is not None else ""
    return f"{p.name} (pid {p.pid}, your rule {p.rule.pattern!r}) holds " \
           f"{format_bytes(p.rss_bytes)}{rate}"


def gpu_line(g: GpuReading, used: int, total: int, holder: str) -> str:
    share = f"{_share(used, total)} ({format_bytes(used)} of {format_bytes(total)})"
    if g.display_active:
        return f"GPU {g.index} ({g.name}) drives the desktop and {share} of its memory is " \
               f"used{holder}: the desktop may stall"
    return f"GPU {g.index} ({g.name}): {share} of its memory is used{holder}"


# -- causes: their level, threshold and check ----------------------------------------------

# Whether a cause still holds on a fresh assessment: (assessment, cause, the act's job id).
Holds = Callable[["Assessment", str, Optional[str]], bool]


def _seen(a: Assessment, cause: str, job_id: Optional[str]) -> bool:
    """A machine-wide condition of this cause is there."""
    return (cause, None) in a.causes()


def _seen_for_job(a: Assessment, cause: str, job_id: Optional[str]) -> bool:
    """A condition of this cause is there for the same job."""
    return (cause, job_id) in a.causes()


def _below(setting: str) -> Holds:
    """Available memory is under the threshold ``setting`` names."""
    def holds(a: Assessment, cause: str, job_id: Optional[str]) -> bool:
        return a.available_bytes < a.thresholds.at(setting)
    return holds


def _predicted(a: Assessment, cause: str, job_id: Optional[str]) -> bool:
    return _seen(a, cause, None) or a.available_bytes < a.thresholds.pause


def _calm_now(a: Assessment, cause: str, job_id: Optional[str]) -> bool:
    """Room to resume: above the resume threshold, nothing machine-wide at pause or more."""
    return a.available_bytes >= a.thresholds.resume and not any(
        _RANK[c.level] >= _RANK[L.PAUSE] for c in a.conditions
        if c.key.watch not in BUDGET_WATCHES)


@dataclass(frozen=True)
class CauseRule:
    """What a cause means: the level it sets, the most it does, the setting of its threshold
    (None: a job's own budget, a user rule) and its check on a fresh reading."""

    level: L
    act: A
    setting: Optional[str] = None
    holds: Holds = _seen


CAUSES: Mapping[str, CauseRule] = {
    C.MEM_STOP: CauseRule(L.PARK, A.STOP, "stop_available", _below("stop_available")),
    C.MEM_PARK: CauseRule(L.PARK, A.PARK, "park_available", _below("park_available")),
    C.MEM_PAUSE: CauseRule(L.PAUSE, A.PAUSE, "pause_available", _below("pause_available")),
    C.MEM_WARN: CauseRule(L.WARN, A.WARN, "warn_available"),
    C.MEM_PREDICTED: CauseRule(L.PAUSE, A.PAUSE, "pause_horizon_seconds", _predicted),
    C.MEM_TREND: CauseRule(L.WARN, A.WARN, "warn_horizon_seconds"),
    C.MEM_FALLING: CauseRule(L.PARK, A.PARK, "pause_available", _below("pause_available")),
    C.PSI_PAUSE: CauseRule(L.PAUSE, A.PAUSE, "psi_pause_threshold"),
    C.PSI_WARN: CauseRule(L.WARN, A.WARN, "psi_full_threshold"),
    C.BUDGET_RAM: CauseRule(L.PAUSE, A.PAUSE, None, _seen_for_job),
    C.BUDGET_VRAM: CauseRule(L.PAUSE, A.PAUSE, None, _seen_for_job),
    C.BUDGET_RAM_WARN: CauseRule(L.WARN, A.WARN, "budget_warn_percent", _seen_for_job),
    C.BUDGET_VRAM_WARN: CauseRule(L.WARN, A.WARN, "budget_warn_percent", _seen_for_job),
    C.GPU_VRAM: CauseRule(L.WARN, A.WARN, "vram_warn_percent"),
    C.NO_CHECKPOINT: CauseRule(L.WARN, A.WARN, "park_available", _seen_for_job),
    C.RULE_WARN: CauseRule(L.WARN, A.WARN),
    C.CALM: CauseRule(L.OK, A.RESUME, "resume_available", _calm_now),
    C.OK: CauseRule(L.OK, A.OK),
}
_UNKNOWN_CAUSE = CauseRule(L.OK, A.OK)  # a cause not in the table holds while it is seen
# The memory ladder, lowest threshold first: the first one crossed names the condition.
MEMORY_LADDER = (C.MEM_STOP, C.MEM_PARK, C.MEM_PAUSE, C.MEM_WARN)


def _cond(key: CondKey, cause: str, reason: str, job_id: Optional[str] = None) -> Condition:
    return Condition(key, CAUSES[cause].level, cause, reason, job_id)


def _last_resort(c: Optional[Condition]) -> bool:
    """A memory condition so short that the guard parks or stops rather than waits."""
    return c is not None and CAUSES[c.cause].act in (A.PARK, A.STOP)


def _pausing(c: Optional[Condition]) -> bool:
    """A condition whose cause pauses (rather than warns, parks or stops)."""
    return c is not None and CAUSES[c.cause].act is A.PAUSE


# -- the decision -----------------------------------------------------------------------------


def fill_rate(history: FillHistory, now: float, policy: Policy,
              since: Optional[float]) -> Optional[float]:
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


def assess(inp: GuardInput, history: FillHistory, policy: Policy,
           state: GuardState) -> Assessment:
    """The conditions the readings show (no choice of action yet). Pure."""
    now = inp.time
    m = inp.memory
    total = max(1, m.total_bytes)
    th = Thresholds.of(policy, total)
    avail = m.available_bytes
    rate = fill_rate(history, now, policy, state.rate_since)
    tte: Optional[float] = None
    if avail <= th.park:
        tte = 0.0
    elif rate:
        tte = (avail - th.park) / rate

    conds: List[Condition] = []
    mem = _memory_condition(avail, memory_have(avail, total, m.limit_source), th, policy,
                            state, rate)
    if mem is not None:
        conds.append(mem)
    trend, trend_since = _trend_condition(now, avail, th, rate, tte, policy, state)
    if trend is not None:
        conds.append(trend)
    psi, psi_warn_since, psi_pause_since = _psi_condition(now, m.psi_full_avg10, policy, state)
    if psi is not None:
        conds.append(psi)
    job_rates = _budget_conditions(inp, history, policy, state, conds)
    for g in inp.gpus:
        c = _gpu_condition(g, inp, policy)
        if c is not None:
            conds.append(c)
    if avail < th.park:
        conds.extend(_cond(CondKey(Watch.NOCKPT, job.id), C.NO_CHECKPOINT,
                           no_checkpoint_line(job), job.id)
                     for job in inp.jobs if job.state in PAUSED_STATES and not job.checkpoint)
    if any(c.key.watch in MEMORY_WATCHES for c in conds):
        conds.extend(_cond(CondKey(Watch.RULE, str(p.pid)), C.RULE_WARN, rule_line(p))
                     for p in inp.processes
                     if p.rule is not None and p.rule.action == A.WARN and not p.job_id)
    return Assessment(th, avail, rate, tte, tuple(conds), job_rates, psi_warn_since,
                      psi_pause_since, trend_since)


def _memory_condition(avail: int, have: str, th: Thresholds, policy: Policy,
                      state: GuardState, rate: Optional[float]) -> Optional[Condition]:
    for cause in MEMORY_LADDER:
        setting = CAUSES[cause].setting
        assert setting is not None
        line = th.at(setting)
        if avail < line:
            return _cond(MEM_KEY, cause, below_line(cause, have, line, getattr(policy, setting),
                                                    rate))
    if MEM_KEY in state.keys and avail < th.warn + th.hysteresis:
        return _cond(MEM_KEY, C.MEM_WARN, just_above_line(
            have, th.warn, policy.warn_available, th.warn + th.hysteresis))
    return None


def _trend_condition(now: float, avail: int, th: Thresholds, rate: Optional[float],
                     tte: Optional[float], policy: Policy,
                     state: GuardState) -> Tuple[Optional[Condition], Optional[float]]:
    """The prediction's condition, if any, and since when it has been predicted."""
    if tte is None or not rate or avail <= th.park:
        return None, None
    since = state.trend_since if state.trend_since is not None else now
    if 0 < policy.pause_horizon_seconds and tte <= policy.pause_horizon_seconds:
        return _cond(TREND_KEY, C.MEM_PREDICTED, trend_line(rate, tte, th.park)), since
    if 0 < policy.warn_horizon_seconds and tte <= policy.warn_horizon_seconds:
        if now - since >= TREND_HOLD_SECONDS:
            return _cond(TREND_KEY, C.MEM_TREND, trend_line(rate, tte, th.park)), since
        return None, since
    return None, None


def _psi_condition(now: float, psi: Optional[float], policy: Policy, state: GuardState
                   ) -> Tuple[Optional[Condition], Optional[float], Optional[float]]:
    """The pressure condition, if any, and since when PSI is above each threshold."""
    if psi is None:
        return None, None, None
    warn_since = pause_since = None
    if psi > policy.psi_full_threshold:
        warn_since = state.psi_warn_since if state.psi_warn_since is not None else now
    if psi > policy.psi_pause_threshold:
        pause_since = state.psi_pause_since if state.psi_pause_since is not None else now
    cond = None
    if pause_since is not None and now - pause_since >= policy.psi_pause_duration_seconds:
        cond = _cond(PSI_KEY, C.PSI_PAUSE,
                     psi_line(psi, policy.psi_pause_threshold, now - pause_since))
    elif warn_since is not None and now - warn_since >= policy.psi_duration_seconds:
        cond = _cond(PSI_KEY, C.PSI_WARN,
                     psi_line(psi, policy.psi_full_threshold, now - warn_since))
    return cond, warn_since, pause_since


# Each budget of a job: what it watches, the cause over it and the cause near it.
_BUDGETS = ((Watch.RAM, C.BUDGET_RAM, C.BUDGET_RAM_WARN),
            (Watch.VRAM, C.BUDGET_VRAM, C.BUDGET_VRAM_WARN))


def _budget_conditions(inp: GuardInput, history: FillHistory, policy: Policy,
                       state: GuardState, conds: List[Condition]) -> Dict[str, float]:
    """Add a condition for each job at or near one of its budgets; returns each job's RSS
    growth (bytes/s, 0 when noise)."""
    job_rates: Dict[str, float] = {}
    warn_share = policy.budget_warn_percent / 100.0
    for job in inp.jobs:
        if job.state in ENDED_STATES:
            continue
        jf = history.fit(f"rss:{job.id}", inp.time, policy.rate_window_seconds)
        job_rates[job.id] = jf.rate if jf is not None and jf.significant and jf.rate > 0 else 0.0
        for watch, over, near in _BUDGETS:
            used, budget = job.budget(watch)
            if not budget or used is None:
                continue
            key = CondKey(watch, job.id)
            limit = max(float(budget), state.grace.get(key, 0.0))
            if used >= limit:
                conds.append(_cond(key, over, budget_line(job, watch, used, limit, budget),
                                   job.id))
            elif used >= warn_share * budget:
                conds.append(_cond(key, near, budget_line(job, watch, used, limit, budget),
                                   job.id))
    return job_rates


def _gpu_condition(g: GpuReading, inp: GuardInput, policy: Policy) -> Optional[Condition]:
    total, used = g.memory_total_bytes, g.memory_used_bytes
    if not total or used is None or 100.0 * used / total < policy.vram_warn_percent:
        return None
    owner: Dict[int, JobView] = {pid: j for j in inp.jobs for pid in j.pids}
    by_job: Dict[str, int] = {}
    top_proc = None
    for p in g.processes:
        if p.used_memory_bytes is None:
            continue
        job = owner.get(p.pid)
        if job is not None:
            by_job[job.id] = by_job.get(job.id, 0) + p.used_memory_bytes
        elif top_proc is None or p.used_memory_bytes > (top_proc.used_memory_bytes or 0):
            top_proc = p
    job_id = max(by_job, key=lambda k: by_job[k]) if by_job else None
    if job_id is not None:
        label = next(j.label for j in inp.jobs if j.id == job_id)
        holder = f"; {label} holds {format_bytes(by_job[job_id])}"
    elif top_proc is not None:
        holder = f"; {top_proc.name} (pid {top_proc.pid}) holds " \
                 f"{format_bytes(top_proc.used_memory_bytes)}"
    else:
        holder = ""
    return _cond(CondKey(Watch.GPU, str(g.index)), C.GPU_VRAM, gpu_line(g, used, total, holder),
                 job_id)


def decide(inp: GuardInput, history: FillHistory, policy: Policy,
           state: GuardState) -> Decision:
    """What to do now. Pure: the same readings, history, policy and state give the same
    decision. At most one act (pause, resume, park, stop) per call; notifications as many as
    there are new conditions. The returned ``next`` state assumes the notifications were
    sent; acts are recorded with ``acted()`` once carried out (or reported, in dry-run)."""
    now = inp.time
    st = _track_jobs(state, inp, policy)
    a = assess(inp, history, policy, st)
    st = replace(st, psi_warn_since=a.psi_warn_since, psi_pause_since=a.psi_pause_since,
                 trend_since=a.trend_since)

    conds = sorted(a.conditions, key=lambda c: -_RANK[c.level])
    level = conds[0].level if conds else L.OK
    reasons = [c.reason for c in conds]
    targets = _targets(inp, a, st)
    for t in targets:
        if (t.paused or t.parked) and t.by_guard:
            held = L.PARK if t.parked else L.PAUSE
            level = level if _RANK[level] >= _RANK[held] else held
            reasons.append(_held_line(t, a, policy, st))
    memory_short = any(c.key.watch in MEMORY_WATCHES for c in conds)
    top = top_text(inp.processes, inp.jobs) if memory_short else ""
    if top:
        reasons.append(top)

    # Calm enough to count towards a resume: no prediction or pressure either.
    calm = _calm_now(a, C.CALM, None) and not any(c.key in (TREND_KEY, PSI_KEY) for c in conds)
    st = replace(st, calm_since=(st.calm_since if st.calm_since is not None else now)
                 if calm else None)

    actions: List[Action] = []
    if policy.mode != M.OFF:
        notes, st = _announce(conds, level, st, now, inp, a, top)
        actions.extend(notes)
        act = _choose(inp, a, policy, st, targets)
        if act is not None:
            if policy.mode == M.DRY_RUN:
                act = replace(act, dry_run=True)
            actions.append(act)
    if level == L.OK and st.would:
        st = replace(st, would=frozenset())
    st = replace(st, level=level, keys=frozenset(c.key for c in conds))
    return Decision(level, tuple(reasons), a.seconds_to_exhaustion, a.fill_rate_bytes_per_s,
                    a.thresholds, tuple(actions), st, memory_short)


def acted(state: GuardState, action: Action, now: float, policy: Policy,
          done: bool = True) -> GuardState:
    """The state after ``action`` was carried out (or, in dry-run, reported). ``done`` False:
    it was refused; the target is only left alone for a moment."""
    target = action.target
    if not action.acts or target is None:
        return state
    record = {"time": now, "kind": action.kind, "target": target, "message": action.message,
              "dry_run": action.dry_run}
    if action.dry_run:
        return replace(state, would=state.would | {action.key}, last_action=record)
    pending = dict(state.pending)
    pending[target] = (action.kind, now, action.target_state)
    st = replace(state, pending=pending, last_action=record)
    if not done:
        return st
    if action.kind == A.RESUME:
        resumed = dict(st.resumed_at)
        resumed[target] = now
        paused_for = dict(st.paused_for)
        paused_for.pop(target, None)
        # The next automatic resume waits for its own stretch of calm, and fill rates
        # start afresh: what the resumed job does next is news.
        return replace(st, resumed_at=resumed, paused_for=paused_for, calm_since=now,
                       rate_since=now)
    st = replace(st, rate_since=now, calm_since=None)
    if action.kind in (A.PAUSE, A.PARK):
        paused_for = dict(st.paused_for)
        paused_for[target] = action.cause
        relapses = dict(st.relapses)
        if now - st.resumed_at.get(target, -math.inf) < policy.cooldown_seconds:
            relapses[target] = relapses.get(target, 0) + 1
        st = replace(st, paused_for=paused_for, relapses=relapses)
    if action.kind == A.PARK:
        sizes = dict(st.parked_size)
        sizes[target] = int(action.data.get("rss_bytes") or 0)
        st = replace(st, parked_size=sizes)
    return st


def still_holds(action: Action, inp: GuardInput, history: FillHistory, policy: Policy,
                state: GuardState) -> Tuple[bool, str]:
    """Whether ``action``'s cause still holds on a fresh reading ``inp``: (holds, why not).

    An act on a job that is gone or no longer in the state the act needs does not hold."""
    if not action.acts:
        return True, ""
    if action.job_id is not None:
        job = next((j for j in inp.jobs if j.id == action.job_id), None)
        if job is None:
            return False, f"job {action.job_id} is gone"
        needs = _ACT_NEEDS.get(action.kind)
        if needs is not None and job.state not in needs:
            return False, f"{job.label} is {job.state}"
    a = assess(inp, history, policy, state)
    rule = CAUSES.get(action.cause, _UNKNOWN_CAUSE)
    if rule.holds(a, action.cause, action.job_id):
        return True, ""
    if action.kind == A.RESUME:
        return False, "memory is short again"
    return False, f"on a fresh reading the cause ({action.cause}) has passed: " \
                  f"{format_bytes(a.available_bytes)} available"


# The states a job must be in for an act on it.
_ACT_NEEDS: Mapping[str, FrozenSet[str]] = {
    A.PAUSE: RUNNING_STATES, A.PARK: PAUSED_STATES, A.RESUME: PAUSED_STATES | PARKED_STATES}


# -- choosing the one act ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    key: str
    label: str
    job: Optional[JobView]
    proc: Optional[ProcessView]
    rss: int
    rate: float
    running: bool
    paused: bool
    by_guard: bool
    state: str
    parked: bool = False

    @property
    def size(self) -> int:
        vram = (self.job.vram_bytes or 0) if self.job else 0
        return self.rss + vram

    @property
    def growth(self) -> float:
        return self.rate if self.rate >= NOISE_RATE_BYTES_PER_S else 0.0


def _targets(inp: GuardInput, a: Assessment, st: GuardState) -> List[_Target]:
    out: List[_Target] = []
    for j in inp.jobs:
        if j.state in ENDED_STATES:
            continue
        parked = j.state in PARKED_STATES
        by = j.parked_by if parked else j.paused_by
        out.append(_Target(f"job:{j.id}", j.label, j, None, j.rss_bytes or 0,
                           a.job_rates.get(j.id, 0.0), j.state in RUNNING_STATES,
                           j.state in PAUSED_STATES, by == "guard", j.state, parked))
    for p in inp.processes:
        if p.job_id is not None or p.rule is None or p.rule.action not in (A.PAUSE, A.STOP):
            if not p.paused_by_guard:
                continue
        state = S.PAUSED if p.paused_by_guard else S.RUNNING
        out.append(_Target(f"pid:{p.pid}", p.label, None, p, p.rss_bytes,
                           p.rate_bytes_per_s or 0.0, not p.paused_by_guard, p.paused_by_guard,
                           p.paused_by_guard, state))
    return out


def _pending(st: GuardState, t: _Target, now: float) -> bool:
    entry = st.pending.get(t.key)
    if entry is None:
        return False
    _, when, state_then = entry
    return now - when < PENDING_SECONDS and t.state == state_then


def _free(st: GuardState, t: _Target, kind: str, now: float) -> bool:
    return not _pending(st, t, now) and f"{kind}:{t.key}" not in st.would


def _by_urgency(ts: List[_Target]) -> List[_Target]:
    """The one growing fastest first, then the largest."""
    return sorted(ts, key=lambda t: (-t.growth, -t.size, t.key))


def _act(kind: str, t: _Target, reason: str, cause: str, a: Assessment, policy: Policy,
         deadline: Optional[float] = None) -> Action:
    data: Dict[str, Any] = {
        "available_bytes": a.available_bytes,
        "thresholds": a.thresholds.to_json(),
        "fill_rate_bytes_per_s": a.fill_rate_bytes_per_s,
        "seconds_to_exhaustion": a.seconds_to_exhaustion,
        "rss_bytes": t.rss,
        "growth_bytes_per_s": t.growth,
        "cause": cause,
    }
    if t.job is not None:
        data["vram_bytes"] = t.job.vram_bytes
    if deadline is not None:
        data["deadline_seconds"] = deadline
    if reason.startswith(t.label + " "):
        reason = reason[len(t.label) + 1:]  # "paused job x: uses ...", not "job x: job x uses"
    return Action(kind, reason, cause, job_id=t.job.id if t.job else None,
                  pid=t.proc.pid if t.proc else None, label=t.label, deadline_seconds=deadline,
                  key=f"{kind}:{t.key}", target_state=t.state, data=data)


def _deadline(t: _Target, a: Assessment, policy: Policy, cause: str) -> float:
    """0: suspend at once. A Keras job otherwise gets up to ``pause_deadline_seconds`` to stop
    at a batch end, less when exhaustion (or its budget) is nearer."""
    if t.job is None or not t.job.hooked or cause in vocab.LAST_RESORT_CAUSES:
        return 0.0
    d = policy.pause_deadline_seconds
    if a.seconds_to_exhaustion is not None:
        d = min(d, a.seconds_to_exhaustion / 2.0)
    if cause == C.BUDGET_RAM and t.job.ram_budget_bytes and t.growth > 0:
        d = min(d, 0.1 * t.job.ram_budget_bytes / t.growth)
    return 0.0 if d < MIN_INTERVAL_SECONDS else round(d, 3)


def _choose(inp: GuardInput, a: Assessment, policy: Policy, st: GuardState,
            targets: List[_Target]) -> Optional[Action]:
    """The one act for now, in the ladder's order: the last resort, a job over its budget, a
    shortage (actual or predicted), then a resume."""
    now = inp.time
    mem = a.condition(MEM_KEY)
    act = _last_resort_act(mem, a, policy, st, targets, now) if _last_resort(mem) else None
    if act is not None:
        return act
    for c in a.conditions:
        if c.key.watch in BUDGET_WATCHES and _pausing(c):
            t = next((t for t in targets if t.job is not None and t.job.id == c.job_id), None)
            if t is not None and t.running and _free(st, t, A.PAUSE, now):
                return _act(A.PAUSE, t, c.reason, c.cause, a, policy,
                            _deadline(t, a, policy, c.cause))
    act = _shortage_act(a, policy, st, targets, now)
    if act is not None:
        return act
    if st.calm_since is not None and now - st.calm_since >= policy.resume_after_seconds:
        return _resume_act(a, policy, st, targets, now, st.calm_since)
    return None


def _pause_or_stop(t: _Target, reason: str, cause: str, a: Assessment,
                   policy: Policy) -> Action:
    """Pause ``t``; a process a user rule names is stopped where the rule says so."""
    rule = t.proc.rule if t.proc is not None else None
    if rule is not None and rule.action == A.STOP:
        return _act(A.STOP, t, f"{reason} (your rule {rule.pattern!r})", cause, a, policy)
    if rule is not None:
        reason = f"{reason} (your rule {rule.pattern!r})"
    return _act(A.PAUSE, t, reason, cause, a, policy, _deadline(t, a, policy, cause))


def _last_resort_act(mem: Optional[Condition], a: Assessment, policy: Policy, st: GuardState,
                     targets: List[_Target], now: float) -> Optional[Action]:
    """Memory past the park threshold: suspend what grows, else park, else (past the stop
    threshold) stop."""
    assert mem is not None
    running = [t for t in targets if t.running and _free(st, t, A.PAUSE, now)]
    if running:
        return _pause_or_stop(_by_urgency(running)[0], mem.reason, mem.cause, a, policy)
    parkable = [t for t in targets if t.paused and t.job is not None and t.job.checkpoint
                and _free(st, t, A.PARK, now)]
    if parkable:
        best = sorted(parkable, key=lambda t: (not t.by_guard, -t.size, t.key))[0]
        return _act(A.PARK, best, f"{mem.reason}; its checkpoint keeps the progress",
                    C.MEM_PARK, a, policy)
    if CAUSES[mem.cause].act is A.STOP:
        stoppable = [t for t in targets if t.job is not None and (t.paused or t.running)
                     and _free(st, t, A.STOP, now)]
        if stoppable:
            best = sorted(stoppable, key=lambda t: (-t.size, t.key))[0]
            return _act(A.STOP, best, f"{mem.reason}; nothing else is left to free memory",
                        C.MEM_STOP, a, policy)
    return None


def _shortage_act(a: Assessment, policy: Policy, st: GuardState, targets: List[_Target],
                  now: float) -> Optional[Action]:
    """A shortage that pauses: pause the most urgent job; a predicted one pauses only what
    grows. With everything paused and memory still falling, park."""
    mem, trend = a.condition(MEM_KEY), a.condition(TREND_KEY)
    actual = [c for c in (mem, a.condition(PSI_KEY)) if _pausing(c)]
    if not actual and not _pausing(trend):
        return None
    running = [t for t in targets if t.running and _free(st, t, A.PAUSE, now)]
    cause = actual[0] if actual else trend
    assert cause is not None
    if not actual:
        # A predicted shortage pauses only what grows, and not a job resumed a moment ago.
        running = [t for t in running if t.growth > 0
                   and now - st.resumed_at.get(t.key, -math.inf) >= policy.cooldown_seconds]
    if running:
        return _pause_or_stop(_by_urgency(running)[0], cause.reason, cause.cause, a, policy)
    if mem is not None and mem.cause == C.MEM_PAUSE and trend is not None \
            and not any(t.running for t in targets):
        parkable = [t for t in targets if t.paused and t.by_guard and t.job is not None
                    and t.job.checkpoint and _free(st, t, A.PARK, now)]
        if parkable:
            best = sorted(parkable, key=lambda t: (-t.size, t.key))[0]
            return _act(A.PARK, best, f"memory keeps falling with the guard's jobs paused "
                        f"({trend.reason})", C.MEM_FALLING, a, policy)
    return None


def _resume_act(a: Assessment, policy: Policy, st: GuardState, targets: List[_Target],
                now: float, calm_since: float) -> Optional[Action]:
    cands = [t for t in targets if (t.paused or t.parked) and t.by_guard
             and _free(st, t, A.RESUME, now) and _may_resume(t, policy, st)
             and (not t.parked or _room_to_relaunch(t, a, st))]
    if not cands:
        return None
    # A paused job holds its memory already; a parked one needs it back.
    best = sorted(cands, key=lambda t: (t.parked, t.size, t.key))[0]
    reason = (f"available memory has stayed above {format_bytes(a.thresholds.resume)} "
              f"for {now - calm_since:.0f} s ({format_bytes(a.available_bytes)} now)")
    if best.parked:
        reason += "; relaunched from its checkpoint"
    return _act(A.RESUME, best, reason, C.CALM, a, policy)


def _room_to_relaunch(t: _Target, a: Assessment, st: GuardState) -> bool:
    """A parked job comes back only when what it held when parked still leaves the resume
    threshold free."""
    return a.available_bytes - st.parked_size.get(t.key, 0) >= a.thresholds.resume


def _may_resume(t: _Target, policy: Policy, st: GuardState) -> bool:
    if st.relapses.get(t.key, 0) >= MAX_RELAPSES:
        return False
    job = t.job
    if job is None:
        return policy.auto_resume
    auto = job.auto_resume if job.auto_resume is not None else policy.auto_resume
    if not auto:
        return False
    share = policy.budget_warn_percent / 100.0
    for used, budget in ((job.rss_bytes, job.ram_budget_bytes),
                         (job.vram_bytes, job.vram_budget_bytes)):
        if budget and used is not None and used >= share * budget:
            return False  # still at its own budget: resuming would only pause it again
    return True


def _held_line(t: _Target, a: Assessment, policy: Policy, st: GuardState) -> str:
    how = f"'headroom resume {t.job.id}'" if t.job else f"kill -CONT {t.proc.pid}" \
        if t.proc else "hand"
    what = "parked" if t.parked else "paused"
    if not _may_resume(t, policy, st):
        if st.relapses.get(t.key, 0) >= MAX_RELAPSES:
            return f"{t.label} is {what} by the guard; it was stopped again soon after " \
                   f"{MAX_RELAPSES} automatic resumes, so resume it by hand ({how})"
        return f"{t.label} is {what} by the guard; resume it by hand ({how})"
    need = a.thresholds.resume + (st.parked_size.get(t.key, 0) if t.parked else 0)
    verb = "is relaunched from its checkpoint" if t.parked else "resumes"
    return f"{t.label} is {what} by the guard; it {verb} when available memory stays above " \
           f"{format_bytes(need)} for {policy.resume_after_seconds:g} s"


# -- notifications and bookkeeping ------------------------------------------------------------


def _announce(conds: List[Condition], level: str, st: GuardState, now: float,
              inp: GuardInput, a: Assessment, top: str) -> Tuple[List[Action], GuardState]:
    """A ``warn`` notification for each condition that is new or got worse; ``ok`` when all
    is well again after one."""
    announced = dict(st.announced)
    out: List[Action] = []
    seen = set()
    for c in conds:
        rank = _RANK[c.level]
        seen.add(c.key)
        prev = announced.get(c.key)
        if prev is None or rank > prev[0]:
            reason = c.reason
            if top and c.key.watch in MEMORY_WATCHES:
                reason = f"{reason}; {top}"
            out.append(Action(A.WARN, reason, c.cause, job_id=c.job_id, condition=c.key,
                              data={"available_bytes": a.available_bytes,
                                    "total_bytes": inp.memory.total_bytes,
                                    "fill_rate_bytes_per_s": a.fill_rate_bytes_per_s,
                                    "seconds_to_exhaustion": a.seconds_to_exhaustion,
                                    "psi_full_avg10": inp.memory.psi_full_avg10,
                                    "thresholds": a.thresholds.to_json(), "level": c.level,
                                    "cause": c.cause}))
            announced[c.key] = (rank, now)
        elif rank == prev[0]:
            announced[c.key] = (rank, now)
        elif now - prev[1] > ANNOUNCE_HOLD_SECONDS:
            announced[c.key] = (rank, now)  # it eased for a while: a new worsening is news
    for key in [k for k in announced if k not in seen]:
        if now - announced[key][1] > ANNOUNCE_HOLD_SECONDS:
            del announced[key]
    ok_pending = st.ok_pending or bool(out)
    if level == L.OK and st.ok_pending:
        out.append(Action(A.OK, f"memory is back to normal: {format_bytes(a.available_bytes)} "
                          f"available ({_share(a.available_bytes, inp.memory.total_bytes)})",
                          C.OK, data={"available_bytes": a.available_bytes}))
        ok_pending = False
    return out, replace(st, announced=announced, ok_pending=ok_pending)


def _track_jobs(st: GuardState, inp: GuardInput, policy: Policy) -> GuardState:
    """Forget what belongs to jobs that are gone; raise the budget of a job the user resumed
    by hand while it was over it (by another tenth of the budget), so the resume sticks."""
    now = inp.time
    live = {j.id: j for j in inp.jobs if j.state not in ENDED_STATES}
    grace = {k: v for k, v in st.grace.items() if k.ref in live}
    paused_for = dict(st.paused_for)
    margin = 1.0 - policy.budget_warn_percent / 100.0
    for j in live.values():
        prev = st.job_states.get(j.id)
        key = f"job:{j.id}"
        pend = st.pending.get(key)
        ours = pend is not None and pend[0] == A.RESUME and now - pend[1] < PENDING_SECONDS
        by_guard = (prev is not None and prev[0] in PAUSED_STATES and prev[1] == "guard") \
            or key in st.paused_for
        if by_guard and j.state in RUNNING_STATES and j.paused_by is None and not ours:
            for watch, _over, _near in _BUDGETS:
                used, budget = j.budget(watch)
                if budget and used is not None and used >= budget * (1.0 - margin):
                    grace[CondKey(watch, j.id)] = used + margin * budget
            paused_for.pop(key, None)
    keys = {f"job:{i}" for i in live} | {f"pid:{p.pid}" for p in inp.processes}

    def keep(d: Dict[str, Any]) -> Dict[str, Any]:
        return {k: v for k, v in d.items() if k in keys or not k.startswith("job:")}

    return replace(st, grace=grace,
                   job_states={i: (j.state, j.paused_by) for i, j in live.items()},
                   pending=keep(st.pending), resumed_at=keep(st.resumed_at),
                   relapses=keep(st.relapses), paused_for=keep(paused_for),
                   parked_size=keep(st.parked_size))


# -- sampling ---------------------------------------------------------------------------------


def wants_gpus(inp: Optional[GuardInput], policy: Policy) -> bool:
    """Whether VRAM is near a threshold, so the GPUs should be read every tick."""
    if inp is None:
        return False
    for g in inp.gpus:
        if g.memory_total_bytes and g.memory_used_bytes is not None and \
                100.0 * g.memory_used_bytes / g.memory_total_bytes >= \
                policy.vram_warn_percent - VRAM_NEAR_POINTS:
            return True
    for j in inp.jobs:
        if j.vram_budget_bytes and j.vram_bytes is not None and j.state in RUNNING_STATES and \
                j.vram_bytes >= VRAM_BUDGET_NEAR_SHARE * j.vram_budget_bytes:
            return True
    return False


def next_interval(inp: Optional[GuardInput], history: FillHistory, policy: Policy,
                  base_seconds: float, state: Optional[GuardState] = None) -> float:
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
    best = min(best, _interval(headroom, history.fit(MEM, now, policy.rate_window_seconds),
                               BURST_RATE_BYTES_PER_S))
    share = policy.budget_warn_percent / 100.0
    for j in inp.jobs:
        if j.state not in RUNNING_STATES:
            continue
        if j.ram_budget_bytes and j.rss_bytes is not None:
            nxt = share * j.ram_budget_bytes if j.rss_bytes < share * j.ram_budget_bytes \
                else float(j.ram_budget_bytes)
            if state is not None:
                nxt = max(nxt, state.grace.get(CondKey(Watch.RAM, j.id), 0.0))
            if j.rss_bytes < nxt:
                fit = history.fit(f"rss:{j.id}", now, policy.rate_window_seconds)
                best = min(best, _interval(nxt - j.rss_bytes, fit, JOB_BURST_RATE_BYTES_PER_S))
    if wants_gpus(inp, policy):
        best = min(best, max(GPU_MIN_INTERVAL_SECONDS,
                             _gpu_interval(inp, history, policy, upper)))
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
        if j.vram_budget_bytes and j.vram_bytes is not None and j.state in RUNNING_STATES \
                and j.vram_bytes < j.vram_budget_bytes:
            fit = history.fit(f"vram:{j.id}", inp.time, policy.rate_window_seconds)
            best = min(best, _interval(j.vram_budget_bytes - j.vram_bytes, fit,
                                       JOB_BURST_RATE_BYTES_PER_S))
    return best
