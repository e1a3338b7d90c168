"""An engine event as one typed record, from the store to every view.

The engine records an ``EngineEvent`` (``Store.add_event``), pushes its JSON (``to_json``, the
event object of DESIGN.md) and answers ``events`` with them; ``EngineClient.events`` and the
tray's worker read each back with ``from_json``, which takes anything (an older engine's
answer, a garbled push) and gives None for what is not an event. The tray, the dashboard, the
jobs window and ``headroom follow`` read attributes, not keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

from trayapp.jsonvalue import JSONObject
from trayapp.readings import NUMBER, typed_fields

_TYPES: Mapping[str, Tuple[type, ...]] = {
    "id": (int,),
    "time": NUMBER,
    "kind": (str,),
    "level": (str,),
    "message": (str,),
    "job_id": (str,),
    "data": (dict,),
}


@dataclass
class EngineEvent:
    """What happened (``kind``, a ``vocab.EventKind`` word), when (Unix seconds), how loud
    (``level``, a ``vocab.EventLevel`` word), the sentence shown, the job it is about, and its
    details (``data``, as the engine gave them). ``id`` is the store's (None until it is
    written: a write that failed is made again by a later flush, which sets it)."""

    time: float
    kind: str
    level: str = ""  # "" when not said (an older engine's)
    message: str = ""
    job_id: Optional[str] = None
    data: Optional[Mapping[str, Any]] = None
    id: Optional[int] = None

    @property
    def text(self) -> str:
        """The sentence shown: its message, else its kind in words."""
        return self.message or self.kind.replace("_", " ")

    @classmethod
    def from_json(cls, data: Any) -> Optional[EngineEvent]:
        """The event ``data`` holds; None when it is not one (no kind, or no time)."""
        try:
            got = typed_fields(cls, data, _TYPES)
        except ValueError:
            return None
        if "kind" not in got or "time" not in got:
            return None
        got["time"] = float(got["time"])
        return cls(**got)

    def to_json(self) -> JSONObject:
        return {
            "id": self.id,
            "time": self.time,
            "kind": self.kind,
            "level": self.level,
            "message": self.message,
            "job_id": self.job_id,
            "data": None if self.data is None else dict(self.data),
        }
