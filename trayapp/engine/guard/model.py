"""What the guard's decision takes and gives: the policy, the readings of one tick (jobs,
processes), what the readings mean (thresholds, conditions), the state kept between ticks,
and the decision with its actions. Data only; the rules are in ``core``, ``causes`` and
``choice``, the sentences in ``text``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Dict, FrozenSet, Iterable, Mapping, NamedTuple, Optional, Tuple

from trayapp import vocab
from trayapp.config import GUARD_SETTINGS, Setting, Threshold
from trayapp.engine.guard import text
from trayapp.jobs.record import JobRecord, smaller_accumulation
from trayapp.readings import GpuReading, MemoryReading
from trayapp.vocab import GuardAct as A
from trayapp.vocab import GuardLevel as L

LEVELS = vocab.LEVELS
RANK = vocab.RANK
RUNNING_STATES = vocab.RUNNING
PAUSED_STATES = vocab.PAUSED
PARKED_STATES = vocab.PARKED
ENDED_STATES = vocab.ENDED
EVENT_KINDS = vocab.GUARD_EVENTS
_AVAILABLE = "_available"  # a threshold setting's name: "<its field in Thresholds>_available"
_HYSTERESIS = "hysteresis"  # not a step of the ladder, not in the status


# -- what a condition is about ----------------------------------------------------------------


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
        changed = [
            f"{k}={v!r}"
            for k, v in self.__dict__.items()
            if k == "rules" and v or k != "rules" and v != _DEFAULTS[k]
        ]
        return f"Policy({', '.join(changed)})"

    @classmethod
    def from_config(cls, config: Any) -> Policy:
        """The policy from a loaded ``trayapp.config.Config`` (values already validated)."""
        return cls(
            rules=(
                Rule(str(r["process"]), str(r.get("action", A.WARN)))
                for r in getattr(config, "rules", ()) or ()
            ),
            **{key: config[s.name] for key, s in GUARD_SETTINGS.items()},
        )


def _ram_need(job: JobRecord) -> Optional[int]:
    """The RAM the job's fit needs at the micro-batch it trains, from its last forecast."""
    need = job.forecast.ram_need_bytes if job.forecast is not None else None
    return need if isinstance(need, int) and not isinstance(need, bool) and need > 0 else None


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
    # Parking relaunches it at once at this accumulation (half the micro-batch, the same
    # training), without waiting for memory; None: it cannot shrink.
    shrinks_to: Optional[int] = None
    batch: Optional[int] = None  # the batch each update sees, when the runner said
    create_time: Optional[float] = None  # of its root (pids[0]): a reused pid is not it
    # Paused mid-step: its tree suspended (or its cgroup frozen), not stopped at a batch end.
    suspended: bool = False
    # The RAM its fit needs at the micro-batch it trains (its last forecast), when known.
    ram_need_bytes: Optional[int] = None

    @property
    def label(self) -> str:
        return text.job_label(self.id, self.name)

    @classmethod
    def of(cls, job: JobRecord) -> JobView:
        """The job manager's record of a job as the decision sees it. A job can be parked only
        with a checkpoint folder and the runner's Keras hook (the runner writes the
        checkpoint); whether it resumes by itself is what the user asked for at its launch,
        else the guard's setting then."""
        asked = job.spec.get("auto_resume")
        return cls(
            id=job.id,
            name=job.name,
            state=job.state,
            pids=job.pids or ((job.pid,) if job.pid else ()),
            rss_bytes=job.rss_bytes,
            vram_bytes=job.vram_bytes,
            hooked=job.hooked,
            # A kernel's fit can be interrupted (its "park") whenever one runs.
            checkpoint=job.kernel_in_fit
            if job.is_kernel
            else bool(job.checkpoint_dir) and job.hooked,
            ram_budget_bytes=job.ram_budget_bytes,
            vram_budget_bytes=job.vram_budget_bytes,
            paused_by=job.paused_by,
            auto_resume=asked if isinstance(asked, bool) else job.auto_resume,
            parked_by=job.parked_by if job.state in PARKED_STATES else None,
            shrinks_to=smaller_accumulation(job),
            batch=job.batch,
            create_time=job.create_time,
            suspended=job.pause_mode == vocab.PauseMode.SUSPENDED,
            ram_need_bytes=_ram_need(job),
        )

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
    own: bool = False  # the engine's own process

    @property
    def label(self) -> str:
        return text.process_label(self.name, self.pid)


@dataclass(frozen=True)
class GuardInput:
    """One tick's readings: memory, GPUs, the guard's jobs and (when sampled) top processes."""

    time: float
    memory: MemoryReading
    gpus: Tuple[GpuReading, ...] = ()
    jobs: Tuple[JobView, ...] = ()
    processes: Tuple[ProcessView, ...] = ()
    gpus_fresh: bool = True  # the GPU readings were taken this tick


# -- what the readings mean --------------------------------------------------------------


@dataclass(frozen=True)
class Thresholds:
    """The policy's thresholds in bytes for one total. Each field is named after its
    setting: ``warn`` is ``warn_available``..., ``hysteresis`` is ``hysteresis``."""

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
        """``{"warn_bytes": ..., "pause_bytes": ..., "park_bytes": ..., "stop_bytes": ...,
        "resume_bytes": ...}`` (DESIGN.md's status)."""
        return {f"{name}_bytes": getattr(self, name) for name in _STEPS}

    def at(self, setting: str) -> int:
        """The bytes of the threshold setting ``setting`` names (``pause_available``...)."""
        return int(getattr(self, setting.removesuffix(_AVAILABLE)))

    def below(self, available: int) -> int:
        """The nearest threshold under ``available`` (0 when it is under all of them)."""
        under = [x for x in (self.warn, self.pause, self.park, self.stop) if x < available]
        return max(under) if under else 0


# The ladder's steps among the thresholds (what the status shows).
_STEPS = tuple(f.name for f in fields(Thresholds) if f.name != _HYSTERESIS)


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
    paused_growth: Dict[str, float] = field(default_factory=dict)  # target -> its growth
    # (bytes/s) when the guard paused it
    waits_said: FrozenSet[str] = frozenset()  # targets whose wait to resume was said
    job_states: Dict[str, Tuple[str, Optional[str]]] = field(default_factory=dict)
    would: FrozenSet[str] = frozenset()  # dry-run: actions already reported
    keys: FrozenSet[CondKey] = frozenset()  # the condition keys of the last decision
    last_action: Optional[Dict[str, Any]] = None


# -- outputs ----------------------------------------------------------------------------------


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
        return text.act_line(self.kind, self.label, self.reason, self.dry_run)


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
