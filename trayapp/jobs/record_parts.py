"""The parts of a job's record that come from its runner or from the engine's reading of it:
the last checkpoint, the notes, the forecast's verdict. Typed and frozen, with the checks a part
must pass when a record is read back (``from_json``: an engine adopting jobs from the store
trusts no earlier engine's record, and a job wrote what its runner sent). The runner's own
messages (``hello``, ``bye``) are kept as the records ``trayapp.jobs.messages`` parses them to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from trayapp.jobs import messages
from trayapp.jobs.bounded import (
    MAX_BYTES,
    MAX_COUNT,
    MAX_PATH,
    MAX_TEXT,
    Bad,
    boolean,
    int_in,
    number,
    optional,
    text,
)
from trayapp.jsonvalue import JSONObject
from trayapp.runner import protocol as rp

_COUNT = optional(int_in(0, MAX_COUNT))
_PATH = optional(text(MAX_PATH))
_SIZE = optional(int_in(0, MAX_BYTES))
_TIME = optional(number)


def _object(value: Any) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise Bad("not an object")
    return value


@dataclass(frozen=True)
class Checkpoint:
    """The last checkpoint the runner saved: where, and how far training was (``epoch``
    counted from 0, the epochs done; ``step`` the batches of the next one done)."""

    path: str
    epoch: Optional[int] = None
    step: Optional[int] = None
    time: Optional[float] = None

    def to_json(self) -> JSONObject:
        return {"path": self.path, "epoch": self.epoch, "step": self.step, "time": self.time}

    @classmethod
    def from_json(cls, value: Any) -> Checkpoint:
        v = _object(value)
        path = _PATH(v.get("path"))
        if not path:
            raise Bad("a checkpoint without its path")
        return cls(
            path,
            _COUNT(v.get("epoch")),
            _COUNT(v.get("step")),
            _TIME(v.get("time")),
        )


@dataclass(frozen=True)
class Note:
    """A line the runner said about the job ("no fit() call: progress not available")."""

    message: str
    level: str = rp.NOTE_INFO
    time: Optional[float] = None

    def to_json(self) -> JSONObject:
        return {"time": self.time, "level": self.level, "message": self.message}

    @classmethod
    def from_json(cls, value: Any) -> Note:
        v = _object(value)
        level = v.get("level")
        return cls(
            text(MAX_TEXT)(v.get("message") or ""),
            level if level in rp.NOTE_LEVELS else rp.NOTE_INFO,
            _TIME(v.get("time")),
        )


@dataclass(frozen=True)
class Forecast:
    """The engine's verdict on a fit's forecast (``forecasts.Judgement``): whether it fits,
    the accumulation it trains at, and the RAM the guard waits for before resuming it."""

    message: str = ""
    fits: bool = False
    accumulation: Optional[int] = None
    need_bytes: Optional[int] = None
    free_bytes: Optional[int] = None
    ram_need_bytes: Optional[int] = None

    def to_json(self) -> JSONObject:
        out: JSONObject = {
            "message": self.message,
            "fits": self.fits,
            "accumulation": self.accumulation,
            "need_bytes": self.need_bytes,
            "free_bytes": self.free_bytes,
        }
        if self.ram_need_bytes is not None:
            out["ram_need_bytes"] = self.ram_need_bytes
        return out

    @classmethod
    def from_json(cls, value: Any) -> Forecast:
        v = _object(value)
        return cls(
            text(MAX_TEXT)(v.get("message") or ""),
            boolean(v.get("fits", False)),
            _COUNT(v.get("accumulation")),
            _SIZE(v.get("need_bytes")),
            _SIZE(v.get("free_bytes")),
            _SIZE(v.get("ram_need_bytes")),
        )


@dataclass(frozen=True)
class ProcessSettings:
    """How the job's process was launched beside the desktop: its nice, its OOM score
    adjustment and its log's cap (``[jobs]`` settings at its launch). None where it was not
    recorded (a job launched before they were, an adopted kernel)."""

    nice: Optional[int] = None
    oom_score_adj: Optional[int] = None
    log_max_bytes: Optional[int] = None

    def to_json(self) -> JSONObject:
        return {
            "nice": self.nice,
            "oom_score_adj": self.oom_score_adj,
            "log_max_bytes": self.log_max_bytes,
        }

    @classmethod
    def from_json(cls, value: Any) -> ProcessSettings:
        """Read back leniently: a value out of its range is not recorded."""
        v = _object(value)
        return cls(
            _lenient(_NICE, v.get("nice")),
            _lenient(_OOM_SCORE, v.get("oom_score_adj")),
            _lenient(_SIZE, v.get("log_max_bytes")),
        )


_NICE = optional(int_in(-20, 19))
_OOM_SCORE = optional(int_in(-1000, 1000))


def _lenient(read: Any, value: Any) -> Any:
    try:
        return read(value)
    except Bad:
        return None


def tf_memory_from_json(value: Any) -> messages.TfMemory:
    """One device's TensorFlow count as kept in a record, checked as the runner's message is."""
    return messages.tf_memory(value)


def hello_from_json(value: Any) -> messages.Hello:
    """The runner's hello as kept in a record, parsed again as the engine parses the message."""
    return _reparse(rp.HELLO, value, messages.Hello)


def bye_from_json(value: Any) -> messages.Bye:
    return _reparse(rp.BYE, value, messages.Bye)


def _reparse(kind: str, value: Any, want: type) -> Any:
    v = _object(value)
    record, _ = messages.parse_message(
        {**{k: x for k, x in v.items() if k != "time"}, "type": kind}
    )
    if not isinstance(record, want):
        raise Bad(f"not a {kind}")
    return record
