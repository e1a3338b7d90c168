"""A job's checkpoints as the engine lists them (``engine/checkpoints.py``): one record per
``fit-<n>`` folder and one for the listing, from the engine to the jobs window.

The engine answers ``job_checkpoints`` with ``CheckpointListing.to_json``; ``EngineClient``
reads the answer back with ``from_json``, which takes anything and keeps what has its type (a
checkpoint's name and fit are needed; what else cannot be read is not known).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Tuple

from trayapp.jsonvalue import JSONObject
from trayapp.readings import NUMBER, readable, typed_fields

_CHECKPOINT_TYPES: Mapping[str, Tuple[type, ...]] = {
    "name": (str,),
    "path": (str,),
    "fit": (int,),
    "epoch": (int,),
    "step": (int,),
    "finished": (bool,),
    "time": NUMBER,
    "size_bytes": (int,),
    "weights": (bool,),
}


@dataclass(frozen=True)
class CheckpointInfo:
    """One ``fit-<n>`` folder: its name and path, the fit it saved (from 1), where it got
    (``epoch`` to start from, counted from 0, and the batches of it done), whether that fit
    had finished, when it was saved, the size of the runner's files, whether the weights are
    there."""

    name: str
    fit: int
    path: str = ""
    epoch: Optional[int] = None
    step: Optional[int] = None
    finished: bool = False
    time: Optional[float] = None
    size_bytes: Optional[int] = None
    weights: bool = False

    @classmethod
    def from_json(cls, data: Any) -> CheckpointInfo:
        """Raises ValueError for what is not a checkpoint (no name, no fit)."""
        got = typed_fields(cls, data, _CHECKPOINT_TYPES)
        if "name" not in got or "fit" not in got:
            raise ValueError("a checkpoint has a name and a fit")
        if "time" in got:
            got["time"] = float(got["time"])
        return cls(**got)

    def to_json(self) -> JSONObject:
        return {
            "name": self.name,
            "path": self.path,
            "fit": self.fit,
            "epoch": self.epoch,
            "step": self.step,
            "finished": self.finished,
            "time": self.time,
            "size_bytes": self.size_bytes,
            "weights": self.weights,
        }


@dataclass(frozen=True)
class CheckpointListing:
    """A job's checkpoint folder (None: the job has none) and whether it exists, with its
    checkpoints in fit order."""

    job: Optional[str] = None
    folder: Optional[str] = None
    exists: bool = False
    checkpoints: Tuple[CheckpointInfo, ...] = ()

    def named(self, name: str) -> Optional[CheckpointInfo]:
        return next((c for c in self.checkpoints if c.name == name), None)

    def later_than(self, name: str) -> List[str]:
        """The checkpoints of fits after ``name``'s (``fit-3`` and ``fit-4`` after ``fit-2``):
        a relaunch with --resume would continue from the last of them, so continuing from
        ``name`` deletes them first."""
        found = self.named(name)
        if found is None:
            return []
        return [c.name for c in self.checkpoints if c.fit > found.fit]

    @classmethod
    def from_json(cls, data: Any) -> CheckpointListing:
        if not isinstance(data, Mapping):
            return cls()
        job, folder = data.get("job"), data.get("folder")
        return cls(
            job=job if isinstance(job, str) else None,
            folder=folder if isinstance(folder, str) else None,
            exists=data.get("exists") is True,
            checkpoints=readable(CheckpointInfo.from_json, data.get("checkpoints")),
        )

    def to_json(self) -> JSONObject:
        return {
            "job": self.job,
            "folder": self.folder,
            "exists": self.exists,
            "checkpoints": [c.to_json() for c in self.checkpoints],
        }
