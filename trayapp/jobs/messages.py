"""A job's messages, parsed at the engine's edge into typed, bounded records.

A job runs the user's code, and that code can read the job's key and send anything on its
channel. So nothing a job sends is kept as it came: each message becomes one of the frozen
records below, with known fields only, each checked (integers in range, finite numbers, short
texts with control characters escaped, lists of bounded length, nesting of bounded depth).
A field that fails its check is dropped (the rest of the message is kept) and named in the
``dropped`` list that comes back with the record, so the launcher can count it and say so.
The records' ``to_json`` give the plain dicts the job's record keeps. The checks are
``jobs.bounded``'s.

Stdlib only, no I/O. The runner side (``trayapp.runner.protocol``) is unchanged: the engine
parses, the runner just sends.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Tuple

from trayapp.jobs import bounded
from trayapp.jobs.bounded import (  # the bounds and Bad, by the names they had here
    MAX_BYTES,
    MAX_COUNT,
    MAX_ITEMS,
    MAX_NAME,
    MAX_PATH,
    MAX_PID,
    MAX_TEXT,
    Bad,
    plain,
)
from trayapp.jsonvalue import JSONObject
from trayapp.runner import forecast as rf
from trayapp.runner import protocol as rp
from trayapp.text import one_line

# Runner states, note levels and bye reasons: the engine acts on them, so only these count.
# They are the runner's words (trayapp.runner.protocol), not job states.
RUNNER_RUNNING = rp.STATE_RUNNING
RUNNER_PAUSED = rp.STATE_PAUSED
RUNNER_PARKING = rp.STATE_PARKING
RUNNER_STOPPING = rp.STATE_STOPPING
RUNNER_IDLE = rp.STATE_IDLE  # a kernel between fit() calls
RUNNER_STATES = rp.RUNNER_STATES
NOTE_INFO = rp.NOTE_INFO
NOTE_LEVELS = rp.NOTE_LEVELS
NOTE_TOPICS = rp.NOTE_TOPICS  # notes the engine records as their own event
FORECAST_HOWS = frozenset({rf.STEPS, rf.PROBE})
BYE_PARKED = rp.BYE_PARKED
BYE_STOPPED = rp.BYE_STOPPED
BYE_REASONS = rp.BYE_REASONS
FIT_HOOK_INSTALLED = rp.FIT_HOOK_INSTALLED  # keras.Model.fit is patched: pause, park and stop
FIT_HOOKS = rp.FIT_HOOKS

_int_in, _optional, _text = bounded.int_in, bounded.optional, bounded.text
_choice, _bool, _number = bounded.choice, bounded.boolean, bounded.number
_plain_at, _objects = bounded.plain_at, bounded.objects
MAX_DEPTH = bounded.MAX_DEPTH  # nesting of a free-form value


# -- the records --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TfMemory:
    """TensorFlow's own count for one device: bytes in use now and at the peak."""

    device: str
    current_bytes: Optional[int]
    peak_bytes: Optional[int]

    def to_json(self) -> JSONObject:
        return {
            "device": self.device,
            "current_bytes": self.current_bytes,
            "peak_bytes": self.peak_bytes,
        }


def tf_memory(value: Any) -> TfMemory:
    """One device's entry of a progress message's ``tf_memory``."""
    if not isinstance(value, dict) or not set(value) <= {"device", "current_bytes", "peak_bytes"}:
        raise Bad("not {device, current_bytes, peak_bytes}")
    size = _optional(_int_in(0, MAX_BYTES))
    return TfMemory(
        _text(MAX_NAME)(value.get("device") or ""),
        size(value.get("current_bytes")),
        size(value.get("peak_bytes")),
    )


def _metrics(value: Any) -> Tuple[Tuple[str, Optional[float]], ...]:
    if not isinstance(value, dict):
        raise Bad("not an object")
    if len(value) > MAX_ITEMS:
        raise Bad("too many items")
    number = _optional(_number)
    return tuple((_text(MAX_NAME)(k), number(v)) for k, v in value.items())


_COUNT = _optional(_int_in(0, MAX_COUNT))


@dataclass(frozen=True)
class Message:
    """What every record has: its ``given`` fields (present and valid), in ``to_json``."""

    given: FrozenSet[str] = field(default=frozenset(), compare=False)

    def to_json(self) -> JSONObject:
        """The given fields as plain JSON values (tuples as lists, records as dicts)."""
        return {name: _json(getattr(self, name)) for name in sorted(self.given)}


def _json(value: Any) -> Any:
    if isinstance(value, (TfMemory, ForecastDevice)):
        return value.to_json()
    if isinstance(value, tuple):
        return [_json(v) for v in value]
    return value


@dataclass(frozen=True)
class Hello(Message):
    """The runner's hello: applied options, versions, devices, whether fit() is hooked."""

    job_id: Optional[str] = None
    pid: Optional[int] = None
    python: Optional[str] = None
    python_version: Optional[str] = None
    script: Optional[str] = None
    runner_version: Optional[int] = None
    options: Any = None
    applied: Tuple[Any, ...] = ()
    tf_version: Optional[str] = None
    keras_version: Optional[str] = None
    tf_imported: Optional[bool] = None
    build_info: Any = None
    tf_devices: Optional[Tuple[Any, ...]] = None
    fit_hook: Optional[str] = None
    hooked: Optional[bool] = None
    state: Optional[str] = None
    error: Optional[str] = None


@dataclass(frozen=True)
class Progress(Message):
    fit: Optional[int] = None
    epoch: Optional[int] = None
    epochs: Optional[int] = None
    step: Optional[int] = None
    steps: Optional[int] = None
    logs: Tuple[Tuple[str, Optional[float]], ...] = ()
    tf_memory: Optional[Tuple[TfMemory, ...]] = None
    batch: Optional[int] = None
    micro_batch: Optional[int] = None
    accumulation: Optional[int] = None
    shrinkable: Optional[bool] = None

    def to_json(self) -> JSONObject:
        out = super().to_json()
        if "logs" in self.given:
            out["logs"] = dict(self.logs)
        return out


@dataclass(frozen=True)
class State(Message):
    state: Optional[str] = None
    epoch: Optional[int] = None
    step: Optional[int] = None


@dataclass(frozen=True)
class Checkpointed(Message):
    path: Optional[str] = None
    epoch: Optional[int] = None
    step: Optional[int] = None
    fit: Optional[int] = None
    reason: Optional[str] = None


@dataclass(frozen=True)
class Note(Message):
    level: str = NOTE_INFO
    message: str = ""
    topic: Optional[str] = None  # what the note is about, when the engine acts on it


@dataclass(frozen=True)
class ForecastDevice:
    """One device's forecast: ``fixed + per_sample x micro-batch`` bytes."""

    device: str
    fixed_bytes: int
    per_sample_bytes: int
    peak_bytes: Optional[int]
    measured_batch: Optional[int]

    def to_json(self) -> JSONObject:
        return {
            "device": self.device,
            "fixed_bytes": self.fixed_bytes,
            "per_sample_bytes": self.per_sample_bytes,
            "peak_bytes": self.peak_bytes,
            "measured_batch": self.measured_batch,
        }


_FORECAST_KEYS = frozenset(
    {"device", "fixed_bytes", "per_sample_bytes", "peak_bytes", "measured_batch"}
)


def _forecast_device(value: Any) -> ForecastDevice:
    if not isinstance(value, dict) or not set(value) <= _FORECAST_KEYS:
        raise Bad("not {device, fixed_bytes, per_sample_bytes, peak_bytes, measured_batch}")
    size = _int_in(0, MAX_BYTES)
    return ForecastDevice(
        _text(MAX_NAME)(value.get("device") or ""),
        size(value.get("fixed_bytes")),
        size(value.get("per_sample_bytes")),
        _optional(size)(value.get("peak_bytes")),
        _COUNT(value.get("measured_batch")),
    )


def _device_bytes(value: Any) -> Tuple[str, int]:
    if not isinstance(value, dict) or not set(value) <= {"device", "bytes"}:
        raise Bad("not {device, bytes}")
    return _text(MAX_NAME)(value.get("device") or ""), _int_in(0, MAX_BYTES)(value.get("bytes"))


@dataclass(frozen=True)
class Forecast(Message):
    """The memory a fit needs, measured in its first steps or by --fit-batch's probe."""

    fit: Optional[int] = None
    how: Optional[str] = None
    batch: Optional[int] = None
    micro_batch: Optional[int] = None
    accumulation: Optional[int] = None
    devices: Tuple[ForecastDevice, ...] = ()
    accumulators: Tuple[Tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Bye(Message):
    reason: Optional[str] = None
    exit_code: Optional[int] = None


JobMessage = Message  # one of the records above

_BUILD_INFO_KEYS = frozenset({"is_cuda_build", "cuda_version", "cudnn_version"})


def _build_info(value: Any) -> Dict[str, Any]:
    if not isinstance(value, dict) or not set(value) <= _BUILD_INFO_KEYS:
        raise Bad("not {is_cuda_build, cuda_version, cudnn_version}")
    version = _optional(_text(MAX_NAME))
    return {
        "is_cuda_build": _optional(_bool)(value.get("is_cuda_build")),
        "cuda_version": version(_version_text(value.get("cuda_version"))),
        "cudnn_version": version(_version_text(value.get("cudnn_version"))),
    }


def _version_text(value: Any) -> Any:
    # TensorFlow's build info gives some versions as numbers.
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(plain(value))
    return value


_NAME = _optional(_text(MAX_NAME))
_PATH = _optional(_text(MAX_PATH))

# message type -> (record, {field: check})
_SCHEMAS: Dict[str, Tuple[type, Mapping[str, Callable[[Any], Any]]]] = {
    rp.HELLO: (
        Hello,
        {
            "job_id": _NAME,
            "pid": _optional(_int_in(0, MAX_PID)),
            "python": _PATH,
            "python_version": _NAME,
            "script": _PATH,
            "runner_version": _optional(_int_in(0, MAX_COUNT)),
            "options": _plain_at(2),
            "applied": _objects(_plain_at(3)),
            "tf_version": _NAME,
            "keras_version": _NAME,
            "tf_imported": _optional(_bool),
            "build_info": _optional(_build_info),
            "tf_devices": _optional(_objects(_plain_at(1))),
            "fit_hook": _optional(_choice(FIT_HOOKS)),
            "hooked": _optional(_bool),
            "state": _optional(_choice(RUNNER_STATES)),
            "error": _optional(_text(MAX_TEXT)),
        },
    ),
    rp.PROGRESS: (
        Progress,
        {
            "fit": _COUNT,
            "epoch": _COUNT,
            "epochs": _COUNT,
            "step": _COUNT,
            "steps": _COUNT,
            "logs": _metrics,
            "tf_memory": _optional(_objects(tf_memory)),
            "batch": _COUNT,
            "micro_batch": _COUNT,
            "accumulation": _COUNT,
            "shrinkable": _optional(_bool),
        },
    ),
    rp.STATE: (State, {"state": _choice(RUNNER_STATES), "epoch": _COUNT, "step": _COUNT}),
    rp.CHECKPOINTED: (
        Checkpointed,
        {
            "path": _text(MAX_PATH),
            "epoch": _COUNT,
            "step": _COUNT,
            "fit": _COUNT,
            "reason": _NAME,
        },
    ),
    rp.NOTE: (
        Note,
        {
            "level": _choice(NOTE_LEVELS),
            "message": _text(MAX_TEXT),
            "topic": _optional(_choice(NOTE_TOPICS)),
        },
    ),
    rp.FORECAST: (
        Forecast,
        {
            "fit": _COUNT,
            "how": _optional(_choice(FORECAST_HOWS)),
            "batch": _COUNT,
            "micro_batch": _COUNT,
            "accumulation": _COUNT,
            "devices": _objects(_forecast_device, 16),
            "accumulators": _objects(_device_bytes, 16),
        },
    ),
    rp.BYE: (Bye, {"reason": _choice(BYE_REASONS), "exit_code": _optional(_int_in(-255, 255))}),
}


def parse(data: bytes) -> Tuple[JobMessage, List[str]]:
    """Bytes from a job's channel -> (record, what was dropped from it: one short line each).

    Raises ``rp.ProtocolError`` (one line) for a message that cannot be used at all: not JSON,
    too large or too deep to decode, not an object, of an unknown type."""
    try:
        raw = rp.decode(data, rp.JOB_MESSAGES)
    except RecursionError:
        raise rp.ProtocolError("nested too deeply") from None
    return parse_message(raw)


def parse_message(raw: Mapping[str, Any]) -> Tuple[JobMessage, List[str]]:
    """A decoded message (a dict with a known ``type``) -> (record, dropped)."""
    kind = raw.get("type")
    if kind not in _SCHEMAS:
        raise rp.ProtocolError(f"unknown message type {one_line(str(kind), 40)!r}")
    record, schema = _SCHEMAS[str(kind)]
    values: Dict[str, Any] = {}
    dropped: List[str] = []
    for name, value in raw.items():
        if name == "type":
            continue
        check = schema.get(name) if isinstance(name, str) else None
        if check is None:
            dropped.append(f"{kind}: unknown field {one_line(str(name), 40)!r}")
            continue
        try:
            values[name] = check(value)
        except Bad as e:
            dropped.append(f"{kind}: {name} {e}")
        except RecursionError:  # pragma: no cover - every check is bounded in depth
            dropped.append(f"{kind}: {name} nested too deeply")
    return record(given=frozenset(values), **values), dropped


# -- the job's record, as kept --------------------------------------------------------------------

# The fields of a job's record that come from its messages, with the check each must pass when a
# record is read back (an engine adopting jobs from the store trusts no earlier engine's record).
_RECORD_FIELDS: Dict[str, Callable[[Any], Any]] = {
    "tf_memory": _optional(lambda v: [t.to_json() for t in _objects(tf_memory)(v)]),
    "metrics": lambda v: dict(_metrics(v)),
    "runner_state": _optional(_choice(RUNNER_STATES)),
    "epoch": _COUNT,
    "epochs": _COUNT,
    "step": _COUNT,
    "steps": _COUNT,
}


def clean_record(info: Dict[str, Any]) -> List[str]:
    """Check, in place, the fields of a job's record that came from its messages (a record read
    back from the store); a field that fails is reset. Returns the names of those reset."""
    reset = []
    for name, check in _RECORD_FIELDS.items():
        if name not in info:
            continue
        try:
            info[name] = check(info[name])
        except (Bad, RecursionError, TypeError, ValueError, AttributeError):
            info[name] = [] if name == "notes" else {} if name == "metrics" else None
            reset.append(name)
    return reset


# -- saying so, at a bounded rate -----------------------------------------------------------------

REPORT_QUIET_SECONDS = 60.0


class DropLog:
    """Counts what was dropped from each job's messages and says when to report it: the first
    time for a job, then at most once every ``quiet`` seconds (with the count since)."""

    def __init__(
        self, quiet: float = REPORT_QUIET_SECONDS, clock: Callable[[], float] = time.monotonic
    ):
        self.quiet = quiet
        self.clock = clock
        self._jobs: Dict[str, List[float]] = {}  # job -> [total, unreported, last report]

    def count(self, job_id: str) -> int:
        """How many dropped fields (or whole messages) this job has sent."""
        entry = self._jobs.get(job_id)
        return int(entry[0]) if entry else 0

    def add(self, job_id: str, n: int) -> Optional[Tuple[bool, int]]:
        """Count ``n`` more for the job. Returns (first time, count since the last report) when a
        report is due now, else None."""
        entry = self._jobs.setdefault(job_id, [0, 0, -math.inf])
        entry[0] += n
        entry[1] += n
        now = self.clock()
        if now - entry[2] < self.quiet:
            return None
        first = entry[2] == -math.inf
        since = int(entry[1])
        entry[1] = 0
        entry[2] = now
        return first, since

    def forget(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)


def summary(dropped: List[str], limit: int = 3) -> str:
    """The first few dropped fields, as one line."""
    text = "; ".join(dropped[:limit])
    if len(dropped) > limit:
        text += f" (and {len(dropped) - limit} more)"
    return one_line(text, 400)


__all__ = [
    "Bad",
    "Bye",
    "Checkpointed",
    "DropLog",
    "Hello",
    "JobMessage",
    "Note",
    "Progress",
    "State",
    "TfMemory",
    "clean_record",
    "parse",
    "parse_message",
    "plain",
    "summary",
]
