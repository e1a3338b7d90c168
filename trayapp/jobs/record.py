"""A job as the parts of Headroom see it: one typed, frozen record.

The job manager builds it and replaces it (``dataclasses.replace``, ``moved``) as the job
changes; the guard reads it as it is; the store, the control channel, the CLI and the UI carry
it as JSON (``to_json``, the contract of DESIGN.md) and read it back with ``from_json``, which
takes anything (a record of an older version, a hand-edited database row, a garbled reply) and
gives a record whose fields have their types: a field that cannot be read gets its default.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, cast

from trayapp import vocab
from trayapp.jobs import messages
from trayapp.jobs import spec_values as sv
from trayapp.jobs.record_parts import (
    Checkpoint,
    Forecast,
    Note,
    ProcessSettings,
    bye_from_json,
    hello_from_json,
    tf_memory_from_json,
)
from trayapp.jobs.stored_spec import StoredSpec
from trayapp.jsonvalue import JSONObject
from trayapp.runner.protocol import STATE_IDLE as RUNNER_IDLE  # a kernel between fit() calls
from trayapp.vocab import JobState

KERNEL = "kernel"  # the kind of a Jupyter kernel adopted as a job (trayapp.jobs.kernels)

MAX_NOTES = 1000  # notes read back from a record (the engine keeps far fewer)

# Fields renamed since: read the old name when the new one is absent.
_OLD_NAMES = {"parked_by": "park_by", "stopped_by": "stop_by"}


@dataclass(frozen=True)
class JobRecord:
    """One job. Sizes in bytes, times in seconds since the epoch, epochs 1-based as Keras
    prints them (``epoch`` is the one under way or the last one done)."""

    id: str
    name: str = ""
    state: str = JobState.STARTING.value
    kind: str = "script"  # "script" (launched by Headroom) or KERNEL (adopted: jobs.kernels)
    pid: Optional[int] = None
    pids: Tuple[int, ...] = ()
    create_time: Optional[float] = None
    rss_bytes: Optional[int] = None
    vram_bytes: Optional[int] = None
    memory_method: Optional[str] = None  # how rss_bytes was measured ("pss", "rss", "cgroup")
    epoch: Optional[int] = None
    epochs: Optional[int] = None
    step: Optional[int] = None
    steps: Optional[int] = None
    batch: Optional[int] = None  # once shrunk: the effective batch ...
    micro_batch: Optional[int] = None  # ... trained as micro-batches of this size ...
    accumulation: Optional[int] = None  # ... this many to an optimizer update
    shrinkable: bool = False  # the runner can train it at a smaller micro-batch
    # The engine's reading of the fit's last forecast (trayapp.jobs.forecasts.Judgement).
    forecast: Optional[Forecast] = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    eta_seconds: Optional[float] = None
    tf_memory: Optional[Tuple[messages.TfMemory, ...]] = None
    started: Optional[float] = None
    ended: Optional[float] = None
    end_reason: Optional[str] = None
    exit_code: Optional[int] = None
    hooked: bool = False  # the runner said hello: pause and park go through it
    connected: bool = False
    # False once its channel was cut because it did not read what the engine sent: the job is
    # then handled by signals, as one without a runner, until its process is launched again.
    answering: bool = True
    runner_state: Optional[str] = None  # the runner's own word (trayapp.runner.protocol)
    hello: Optional[messages.Hello] = None
    bye: Optional[messages.Bye] = None
    spec: StoredSpec = field(default_factory=StoredSpec)  # its --env as names only
    script: str = ""
    cwd: Optional[str] = None
    argv: Tuple[str, ...] = ()
    checkpoint_dir: Optional[str] = None
    checkpoint: Optional[Checkpoint] = None  # the last checkpoint the runner saved
    log_path: Optional[str] = None
    process: Optional[ProcessSettings] = None  # the priority it was given, its log's cap
    paused_by: Optional[str] = None
    pause_reason: Optional[str] = None
    pause_mode: Optional[str] = None  # "cooperative" (at a batch end) or "suspended" (the tree)
    paused_at: Optional[float] = None
    parked_by: Optional[str] = None
    park_reason: Optional[str] = None
    stopped_by: Optional[str] = None
    stop_reason: Optional[str] = None
    ram_budget_bytes: Optional[int] = None
    vram_budget_bytes: Optional[int] = None
    auto_resume: bool = True
    notes: Tuple[Note, ...] = ()
    warnings: Tuple[str, ...] = ()
    dropped_fields: int = 0
    runs: int = 0
    resumed_at: Optional[float] = None
    resumable: bool = False  # ended with a checkpoint to continue from (parked, or stopped)
    # What guards it besides the guard, in words (trayapp.jobs.cgroups.WORDS), and its memory
    # cgroup's last reading (usage, anon, file, limit, under_oom, oom_kill, failcnt).
    protection: Optional[str] = None
    cgroup_memory: Optional[JSONObject] = None

    def __post_init__(self) -> None:
        if not isinstance(self.spec, StoredSpec):  # a spec given as JSON keeps the names only
            object.__setattr__(self, "spec", StoredSpec(self.spec))

    # -- reading ---------------------------------------------------------------------------

    @property
    def is_live(self) -> bool:
        return self.state in vocab.LIVE

    @property
    def is_ended(self) -> bool:
        return self.state in vocab.ENDED

    @property
    def is_parked(self) -> bool:
        return self.state in vocab.PARKED

    @property
    def is_kernel(self) -> bool:
        return self.kind == KERNEL

    @property
    def kernel_in_fit(self) -> bool:
        """A kernel's fit() is under way, as its runner says (a fit to pause at a batch end or
        to interrupt)."""
        return self.hooked and self.runner_state not in (None, RUNNER_IDLE)

    @property
    def kernel_idle(self) -> bool:
        """A live kernel between fits: the progress it reports is its last fit's."""
        return self.is_kernel and self.is_live and not self.kernel_in_fit

    def moved(self, new: str, **changes: Any) -> JobRecord:
        """This record in state ``new`` (and with ``changes``). A change of state that
        ``vocab.TRANSITIONS`` does not have raises ``ValueError``."""
        if not vocab.can_move(self.state, new):
            raise ValueError(f"job {self.id}: no change of state {self.state} -> {new}")
        return dataclasses.replace(self, state=str(new), **changes)

    def with_(self, **changes: Any) -> JobRecord:
        return dataclasses.replace(self, **changes)

    # -- JSON --------------------------------------------------------------------------------

    def to_json(self) -> JSONObject:
        """The record as plain JSON types (tuples as lists, mappings as dicts)."""
        return {f.name: _plain(getattr(self, f.name)) for f in _FIELDS}

    @classmethod
    def from_json(cls, data: Any) -> JobRecord:
        """A record from ``data``; a field missing or of the wrong type gets its default, an
        unknown key is left out. ``data`` without a string ``id`` raises ``ValueError``."""
        if not isinstance(data, Mapping):
            raise ValueError("a job record is an object")
        job_id = data.get("id")
        if not isinstance(job_id, str) or not job_id:
            raise ValueError("a job record needs an id")
        values: Dict[str, Any] = {"id": job_id}
        for f in _FIELDS[1:]:
            name = f.name
            if name in data:
                raw = data[name]
            elif name in _OLD_NAMES and _OLD_NAMES[name] in data:
                raw = data[_OLD_NAMES[name]]
            else:
                continue
            read = _READERS[name]
            try:
                values[name] = read(raw)
            except (TypeError, ValueError, OverflowError):
                continue  # the default
        return cls(**values)


# -- field readers -------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if isinstance(
        value, (Checkpoint, Note, Forecast, ProcessSettings, messages.TfMemory, messages.Message)
    ):
        return value.to_json()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _opt(read: Any) -> Any:
    return lambda v: None if v is None else read(v)


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise TypeError("not a number")
    return int(v)


def _float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise TypeError("not a number")
    return float(v)


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError("not a string")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise TypeError("not a boolean")
    return v


def _state(v: Any) -> str:
    if v not in vocab.ALL:
        raise ValueError("not a job state")
    return str(v)


def _mapping(v: Any) -> Dict[str, Any]:
    if not isinstance(v, Mapping):
        raise TypeError("not an object")
    return {str(k): x for k, x in v.items()}


def _metrics(v: Any) -> Dict[str, float]:
    out = {}
    for k, x in _mapping(v).items():
        try:
            out[k] = _float(x)
        except TypeError:
            continue
    return out


def _ints(v: Any) -> Tuple[int, ...]:
    if not isinstance(v, (list, tuple)):
        raise TypeError("not a list")
    return tuple(_int(x) for x in v)


def _strs(v: Any) -> Tuple[str, ...]:
    if not isinstance(v, (list, tuple)):
        raise TypeError("not a list")
    return tuple(x for x in v if isinstance(x, str))


def _parts(read: Any) -> Any:
    def parts(v: Any) -> Tuple[Any, ...]:
        if not isinstance(v, (list, tuple)):
            raise TypeError("not a list")
        out = []
        for x in v[:MAX_NOTES]:
            try:
                out.append(read(x))
            except ValueError:
                continue
        return tuple(out)

    return parts


def _json_object(v: Any) -> JSONObject:
    """A part kept as it was read (the cgroup's last reading): JSON from the store or a reply."""
    return cast(JSONObject, _mapping(v))


_FIELDS = dataclasses.fields(JobRecord)
_READERS: Dict[str, Any] = {
    "name": _str,
    "state": _state,
    "kind": _str,
    "pid": _opt(_int),
    "pids": _ints,
    "create_time": _opt(_float),
    "rss_bytes": _opt(_int),
    "vram_bytes": _opt(_int),
    "memory_method": _opt(_str),
    "epoch": _opt(_int),
    "epochs": _opt(_int),
    "step": _opt(_int),
    "steps": _opt(_int),
    "batch": _opt(_int),
    "micro_batch": _opt(_int),
    "accumulation": _opt(_int),
    "shrinkable": _bool,
    "forecast": _opt(Forecast.from_json),
    "metrics": _metrics,
    "eta_seconds": _opt(_float),
    "tf_memory": _opt(_parts(tf_memory_from_json)),
    "started": _opt(_float),
    "ended": _opt(_float),
    "end_reason": _opt(_str),
    "exit_code": _opt(_int),
    "hooked": _bool,
    "connected": _bool,
    "answering": _bool,
    "runner_state": _opt(_str),
    "hello": _opt(hello_from_json),
    "bye": _opt(bye_from_json),
    "spec": StoredSpec.from_json,
    "script": _str,
    "cwd": _opt(_str),
    "argv": _strs,
    "checkpoint_dir": _opt(_str),
    "checkpoint": _opt(Checkpoint.from_json),
    "log_path": _opt(_str),
    "process": _opt(ProcessSettings.from_json),
    "paused_by": _opt(_str),
    "pause_reason": _opt(_str),
    "pause_mode": _opt(_str),
    "paused_at": _opt(_float),
    "parked_by": _opt(_str),
    "park_reason": _opt(_str),
    "stopped_by": _opt(_str),
    "stop_reason": _opt(_str),
    "ram_budget_bytes": _opt(_int),
    "vram_budget_bytes": _opt(_int),
    "auto_resume": _bool,
    "notes": _parts(Note.from_json),
    "warnings": _strs,
    "dropped_fields": _int,
    "runs": _int,
    "resumed_at": _opt(_float),
    "resumable": _bool,
    "protection": _opt(_str),
    "cgroup_memory": _opt(_json_object),
}
if set(_READERS) != {f.name for f in _FIELDS[1:]}:  # pragma: no cover - caught by any import
    raise ImportError("every field of JobRecord needs a reader")


def records(items: Any) -> List[JobRecord]:
    """The readable records among ``items`` (a list from a reply or the store); the others are
    left out."""
    out = []
    for item in items if isinstance(items, (list, tuple)) else ():
        try:
            out.append(JobRecord.from_json(item))
        except ValueError:
            continue
    return out


# -- what a relaunch at half the micro-batch would be (the guard reads it) ---------------------


def smaller_accumulation(rec: JobRecord) -> Optional[int]:
    """The accumulation of a relaunch at half the micro-batch (the same training), or None
    where the job cannot shrink: the runner says its fit cannot (Keras 2, input it cannot
    re-batch, ``--on-oom stop``), no checkpoint folder to relaunch from, or the half would be
    under ``--min-batch`` or would not split the batch evenly."""
    if not rec.shrinkable or not rec.batch or not rec.checkpoint_dir or not rec.hooked:
        return None
    k = (rec.accumulation or 1) * 2
    if rec.batch % k or rec.batch // k < smallest_micro_batch(rec):
        return None
    return k


def smallest_micro_batch(rec: JobRecord) -> int:
    """The job's ``--min-batch`` (the default when not given)."""
    floor = rec.spec.get("min_batch")
    floor = (
        floor if isinstance(floor, int) and not isinstance(floor, bool) else sv.MIN_BATCH_DEFAULT
    )
    return max(1, floor)
