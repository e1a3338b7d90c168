"""The engine's status as one typed record, from the engine to every view.

The engine builds a ``Status`` (``Engine.status``) and sends its JSON (``to_json``, the status
object of DESIGN.md, ``headroom status --json``); ``EngineClient.status`` and the tray's
worker read it back with ``from_json``, which takes anything (an older engine's answer, a
garbled push) and gives a record whose fields have their types: a part that cannot be read is
not known (None, empty), never a made-up value. The tray, the dashboard, the launch dialog and
the command line then read attributes, not keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Tuple

from trayapp import formats
from trayapp.jobs.record import JobRecord, records
from trayapp.jsonvalue import JSONObject
from trayapp.readings import (
    NUMBER,
    Consumer,
    GpuReading,
    GpuStatus,
    MemoryReading,
    readable,
    typed_fields,
)
from trayapp.vocab import LEVELS, GuardLevel

NO_GPU = GpuStatus("none", "no NVIDIA GPU found")


def _texts(value: Any) -> Tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        return ()
    return tuple(str(v) for v in value if isinstance(v, (str, int, float)) and str(v))


_PROCESS_TYPES: Mapping[str, Tuple[type, ...]] = {
    "pid": (int,),
    "name": (str,),
    "rss_bytes": (int,),
    "rate_bytes_per_s": NUMBER,
    "job_id": (str,),
}
_GUARD_TYPES: Mapping[str, Tuple[type, ...]] = {
    "mode": (str,),
    "seconds_to_exhaustion": NUMBER,
    "fill_rate_bytes_per_s": NUMBER,
    "available_bytes": (int,),
    "total_bytes": (int,),
    "psi_full_avg10": NUMBER,
    "interval_seconds": NUMBER,
    "thresholds": (dict,),
}
_ENGINE_TYPES: Mapping[str, Tuple[type, ...]] = {
    "running": (bool,),
    "pid": (int,),
    "version": (str,),
    "started": NUMBER,
    "demo": (bool,),
    "home": (str,),
    "sample_interval": NUMBER,
    "rlimits": (dict,),
    "clients": (int,),
    "store_error": (str,),
    "metrics": (dict,),
    "protection": (dict,),
}


@dataclass(frozen=True)
class TopProcess:
    """One of the processes that hold the most memory, as the guard saw them last."""

    pid: int
    name: str
    rss_bytes: Optional[int] = None
    rate_bytes_per_s: Optional[float] = None
    job_id: Optional[str] = None

    @classmethod
    def from_json(cls, data: Any) -> TopProcess:
        values = typed_fields(cls, data, _PROCESS_TYPES)
        if "pid" not in values:
            raise ValueError("a process needs a pid")
        return cls(**{"name": "", **values})


@dataclass(frozen=True)
class GuardView:
    """The guard's part of the status (``GuardService.state_json``). ``state`` is None where
    no guard watches (no engine runs: the readings were taken by the CLI itself)."""

    state: Optional[str] = GuardLevel.OK.value
    mode: Optional[str] = "act"
    reasons: Tuple[str, ...] = ()
    seconds_to_exhaustion: Optional[float] = None
    fill_rate_bytes_per_s: Optional[float] = None
    available_bytes: Optional[int] = None
    total_bytes: Optional[int] = None
    psi_full_avg10: Optional[float] = None
    interval_seconds: Optional[float] = None
    thresholds: Mapping[str, Any] = field(default_factory=dict)
    top_processes: Tuple[TopProcess, ...] = ()

    @classmethod
    def from_json(cls, data: Any) -> GuardView:
        if not isinstance(data, Mapping):
            return cls()
        state = data.get("state")
        return cls(
            **{"mode": None, **typed_fields(cls, data, _GUARD_TYPES)},
            state=state if state in LEVELS or state is None else GuardLevel.OK.value,
            reasons=_texts(data.get("reasons")),
            top_processes=readable(TopProcess.from_json, data.get("top_processes")),
        )

    def state_words(self) -> str:
        """``"warn"``, ``"ok (dry-run)"``: the level, and the mode where it is not "act"."""
        state = self.state or GuardLevel.OK.value
        return state + (f" ({self.mode})" if self.mode and self.mode != "act" else "")

    def runs_out(self) -> str:
        """ "memory runs out in ~9 min 39 s" where the guard predicts it and is not at ease;
        "" otherwise (``formats.exhaustion_words``)."""
        return formats.exhaustion_words(
            {"state": self.state, "seconds_to_exhaustion": self.seconds_to_exhaustion}
        )


@dataclass(frozen=True)
class EngineView:
    """The engine's part of the status: itself, its settings' problems, what it serves."""

    running: bool = True
    pid: Optional[int] = None
    version: Optional[str] = None
    started: Optional[float] = None
    demo: bool = False
    home: Optional[str] = None
    sample_interval: Optional[float] = None
    # Resource name -> [soft, hard], None: unlimited (``headroom run --dry-run`` compares).
    rlimits: Optional[Mapping[str, Any]] = None
    clients: int = 0
    store_error: Optional[str] = None
    config_problems: Tuple[str, ...] = ()
    metrics: Mapping[str, Any] = field(default_factory=dict)  # listen, tls, error
    protection: Mapping[str, Any] = field(default_factory=dict)  # what jobs get: words, ...

    @classmethod
    def from_json(cls, data: Any) -> EngineView:
        if not isinstance(data, Mapping):
            return cls(running=False)
        return cls(
            **typed_fields(cls, data, _ENGINE_TYPES),
            config_problems=_texts(data.get("config_problems")),
        )

    def to_json(self) -> JSONObject:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["config_problems"] = list(self.config_problems)
        return out


@dataclass(frozen=True)
class Status:
    """What the engine knows now: the machine's memory and GPUs, the guard, the live jobs, the
    biggest RAM consumers by name, and the engine itself."""

    time: float
    memory: Optional[MemoryReading]
    gpus: Tuple[GpuReading, ...] = ()
    gpu_status: GpuStatus = NO_GPU
    guard: GuardView = GuardView()
    jobs: Tuple[JobRecord, ...] = ()
    consumers: Tuple[Consumer, ...] = ()
    engine: EngineView = EngineView()
    # The guard's part as the engine sent it, for ``headroom status --json`` and the exporter.
    guard_json: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> Status:
        """The status from an answer or a push; anything unreadable in it is not known."""
        if not isinstance(data, Mapping):
            data = {}
        t = float(typed_fields(cls, data, {"time": NUMBER}).get("time", 0.0))
        gpu_status = data.get("gpu_status")
        return cls(
            time=t,
            memory=MemoryReading.from_json(data.get("memory"), t),
            gpus=readable(GpuReading.from_json, data.get("gpus")),
            gpu_status=GpuStatus.from_json(gpu_status)
            if isinstance(gpu_status, Mapping)
            else NO_GPU,
            guard=GuardView.from_json(data.get("guard")),
            jobs=tuple(records(data.get("jobs"))),
            consumers=readable(Consumer.from_json, data.get("consumers")),
            engine=EngineView.from_json(data.get("engine")),
            guard_json=dict(guard) if isinstance(guard := data.get("guard"), Mapping) else {},
        )

    def to_json(self) -> JSONObject:
        """The status object of DESIGN.md."""
        memory = self.memory.to_json() if self.memory is not None else {}
        memory.pop("time", None)
        return {
            "time": self.time,
            "memory": memory,
            "gpus": [g.to_json() for g in self.gpus],
            "gpu_status": self.gpu_status.to_json(),
            "guard": dict(self.guard_json),
            "jobs": [j.to_json() for j in self.jobs],
            "consumers": [c.to_json() for c in self.consumers],
            "engine": self.engine.to_json(),
        }

    # -- reading ---------------------------------------------------------------------------

    @property
    def demo(self) -> bool:
        """The engine runs on simulated GPUs (``--demo``)."""
        return (
            self.engine.demo
            or self.gpu_status.backend == "simulated"
            or any(g.simulated for g in self.gpus)
        )

    @property
    def ram_fraction(self) -> Optional[float]:
        """Share of memory in use as the guard sees it: 1 - available / total (cgroup-aware)."""
        m = self.memory
        if m is None or not m.total_bytes:
            return None
        return max(0.0, min(1.0, 1.0 - float(m.available_bytes) / float(m.total_bytes)))

    @property
    def fullest_gpu(self) -> Optional[GpuReading]:
        """The GPU whose memory is the most full; None when no GPU reports its memory."""
        best, best_frac = None, -1.0
        for g in self.gpus:
            total, used = g.memory_total_bytes, g.memory_used_bytes
            if not total or used is None:
                continue
            if used / total > best_frac:
                best, best_frac = g, used / total
        return best

    @property
    def vram_fraction(self) -> Optional[float]:
        g = self.fullest_gpu
        if g is None or not g.memory_total_bytes or g.memory_used_bytes is None:
            return None
        return max(0.0, min(1.0, g.memory_used_bytes / g.memory_total_bytes))
