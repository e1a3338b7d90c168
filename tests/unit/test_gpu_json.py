"""GPU readings read back from JSON (a status object's ``gpus``), as the CLI reads them."""

from __future__ import annotations

from typing import Any

import pytest

from trayapp.probes.gpu import SimulatedBackend
from trayapp.readings import GpuProcess, GpuReading, GpuStatus, gpu_readings


def test_a_reading_comes_back_as_it_went() -> None:
    backend = SimulatedBackend()
    for g in backend.read():
        assert GpuReading.from_json(g.to_json()) == g
    assert GpuStatus.from_json(backend.status.to_json()) == backend.status


@pytest.mark.parametrize("data, field, value", [
    ({"index": 1}, "name", ""),
    ({"index": 1}, "memory_used_bytes", None),
    ({"index": 1, "memory_used_bytes": "lots"}, "memory_used_bytes", None),
    ({"index": 1, "memory_used_bytes": True}, "memory_used_bytes", None),
    ({"index": 1, "temperature_c": float("nan")}, "temperature_c", None),
    ({"index": 1, "temperature_c": 71}, "temperature_c", 71),
    ({"index": 1, "simulated": "yes"}, "simulated", False),
    ({"index": 1, "unknown_key": 5}, "index", 1),
    ({"index": 1, "processes": "none"}, "processes", ()),
    ({"index": 1, "processes": [{"pid": 7}, {"name": "no pid"}, 3]}, "processes",
     (GpuProcess(7, "", None),)),
])
def test_what_cannot_be_read_is_not_known(data: dict, field: str, value: Any) -> None:
    assert getattr(GpuReading.from_json(data), field) == value


@pytest.mark.parametrize("data", [None, [], "gpu", {}, {"index": "0"}, {"index": None}])
def test_a_reading_needs_an_index(data: Any) -> None:
    with pytest.raises(ValueError):
        GpuReading.from_json(data)
    assert gpu_readings([data, {"index": 2}]) == (GpuReading.from_json({"index": 2}),)


@pytest.mark.parametrize("data, backend", [(None, "none"), ({}, "none"), ("x", "none"),
                                           ({"backend": "nvml", "message": 3}, "nvml")])
def test_a_status_always_reads(data: Any, backend: str) -> None:
    status = GpuStatus.from_json(data)
    assert status.backend == backend and status.message is None
