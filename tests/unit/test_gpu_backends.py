"""GPU backends: NVML over the fake pynvml built from real readings, the null backend, the
simulated GPUs of the demo, and the factory that picks one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import ModuleType

import psutil
import pytest

from tests.fixtures import load_fake_pynvml
from trayapp.probes.gpu import (
    NoGpuBackend,
    NvmlBackend,
    SimulatedBackend,
    cuda_version_text,
    make_backend,
)
from trayapp.probes.names import person_name
from trayapp.readings import GpuReading

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MiB = 1024**2


fp = load_fake_pynvml()


@pytest.fixture
def fake() -> ModuleType:
    return fp.make_fake_pynvml()


@pytest.fixture
def backend(fake: ModuleType):
    b = NvmlBackend(fake)
    yield b
    b.close()


def by_pid(reading: GpuReading) -> dict:
    return {p.pid: p for p in reading.processes}


# --- NVML backend ---------------------------------------------------------------------------


def test_reads_every_field_of_every_gpu(backend: NvmlBackend) -> None:
    g0, g1 = backend.read()
    assert (g0.index, g0.name, g0.uuid) == (
        0, "NVIDIA GeForce RTX 3090", "GPU-8d6a4c1e-2f7b-9a35-0c4d-6e1f2a3b4c5d")
    assert g0.memory_total_bytes == 24576 * MiB
    assert g0.memory_reserved_bytes == 301 * MiB
    assert g0.memory_used_bytes == 19213 * MiB  # v2: without the reserved part
    assert g0.memory_free_bytes == (24576 - 301 - 19213) * MiB
    assert g0.utilization_percent == 97.0
    assert g0.temperature_c == 71.0
    assert g0.power_watts == pytest.approx(331.412)
    assert g0.display_active is True
    assert g0.simulated is False
    assert g0.compute_capability == "8.6"
    procs = by_pid(g0)
    assert set(procs) == {fp.PID_TRAIN, fp.PID_XORG, fp.PID_GNOME_SHELL}
    assert (procs[fp.PID_TRAIN].name, procs[fp.PID_TRAIN].kind) == ("python3", "compute")
    assert procs[fp.PID_TRAIN].used_memory_bytes == 18640 * MiB
    assert (procs[fp.PID_XORG].name, procs[fp.PID_XORG].kind) == ("Xorg", "graphics")
    assert procs[fp.PID_GNOME_SHELL].name == "gnome-shell"
    assert (g1.index, g1.name, g1.display_active) == (1, "NVIDIA RTX A4000", False)
    assert g1.power_watts == pytest.approx(87.523)
    assert [(p.pid, p.used_memory_bytes) for p in g1.processes] == [(fp.PID_TRAIN_2, 6080 * MiB)]


def test_throughput_preset_turns_on_float16_where_the_gpu_has_tensor_cores(
        backend: NvmlBackend) -> None:
    from trayapp.jobs.options import JobSpec, apply_preset

    spec = apply_preset(JobSpec(script="train.py"), "throughput", backend.read())
    assert spec.options.precision == "mixed_float16"
    assert spec.options.xla is True and spec.options.allocator == "cuda_malloc_async"


def test_status_names_driver_and_cuda(backend: NvmlBackend) -> None:
    st = backend.status
    assert (st.backend, st.driver_version, st.cuda_driver_version) == ("nvml", "550.54.14", "12.4")
    assert st.message == "2 NVIDIA GPUs"


@pytest.mark.parametrize("value,text", [(12040, "12.4"), (11080, "11.8"), (12000, "12.0"),
                                        (13010, "13.1"), (None, None), (0, None)])
def test_cuda_version_text(value, text) -> None:  # type: ignore[no-untyped-def]
    assert cuda_version_text(value) == text


def test_wddm_process_memory_is_none_never_zero() -> None:
    fake = fp.make_fake_pynvml([fp.rtx_4070_wddm()], driver="551.61",
                               process_names=fp.WDDM_PROCESS_NAMES)
    b = NvmlBackend(fake)
    try:
        (g,) = b.read()
        procs = by_pid(g)
        # The training process is listed as compute and as graphics: one entry remains.
        assert len(g.processes) == 2
        assert (procs[fp.PID_WIN_TRAIN].name, procs[fp.PID_WIN_TRAIN].kind) == (
            "python.exe", "compute")
        assert procs[fp.PID_DWM].name == "dwm.exe"
        assert all(p.used_memory_bytes is None for p in g.processes)
        assert g.memory_used_bytes == 7412 * MiB  # the device totals are still known
        as_json = json.loads(json.dumps(g.to_json()))
        assert [p["used_memory_bytes"] for p in as_json["processes"]] == [None, None]
    finally:
        b.close()


def test_raw_not_available_from_older_bindings_is_none() -> None:
    fake = fp.make_fake_pynvml([fp.rtx_4070_wddm()], process_names=fp.WDDM_PROCESS_NAMES,
                               raw_not_available=True)
    b = NvmlBackend(fake)
    try:
        (g,) = b.read()
        assert [p.used_memory_bytes for p in g.processes] == [None, None]
    finally:
        b.close()


def test_one_unsupported_field_does_not_hide_the_rest(fake: ModuleType,
                                                      backend: NvmlBackend) -> None:
    fake.fail("nvmlDeviceGetPowerUsage", fake.NVML_ERROR_NOT_SUPPORTED)
    fake.fail("nvmlDeviceGetTemperatureV", fake.NVML_ERROR_NOT_SUPPORTED)
    g0, g1 = backend.read()
    for g in (g0, g1):
        assert g.power_watts is None
        assert g.temperature_c is None
    assert g0.memory_used_bytes == 19213 * MiB
    assert g0.utilization_percent == 97.0
    assert g1.utilization_percent == 45.0
    assert len(g0.processes) == 3
    assert json.loads(json.dumps(g0.to_json()))["power_watts"] is None


def test_driver_without_v3_process_functions(fake: ModuleType, backend: NvmlBackend) -> None:
    fake.fake.driver_lacks.update({"nvmlDeviceGetComputeRunningProcesses_v3",
                                   "nvmlDeviceGetGraphicsRunningProcesses_v3"})
    for _ in range(3):
        g0, _g1 = backend.read()
        assert set(by_pid(g0)) == {fp.PID_TRAIN, fp.PID_XORG, fp.PID_GNOME_SHELL}
    assert fake.fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 1
    assert fake.fake.calls["nvmlDeviceGetGraphicsRunningProcesses_v3"] == 1


def test_old_bindings_use_v1_functions() -> None:
    fake = fp.make_fake_pynvml(old_bindings=True)
    b = NvmlBackend(fake)
    try:
        g0, _ = b.read()
        # v1 memory: "used" includes the reserved part, which v1 cannot name.
        assert g0.memory_reserved_bytes is None
        assert g0.memory_used_bytes == (19213 + 301) * MiB
        assert g0.memory_free_bytes == (24576 - 301 - 19213) * MiB
        assert g0.temperature_c == 71.0
        assert by_pid(g0)[fp.PID_TRAIN].used_memory_bytes == 18640 * MiB
        assert b.status.cuda_driver_version == "12.4"
    finally:
        b.close()


def test_driver_without_memory_v2_falls_back_once(fake: ModuleType,
                                                  backend: NvmlBackend) -> None:
    fake.fake.driver_lacks.add("nvmlDeviceGetMemoryInfo_v2")
    for _ in range(3):
        g0, _ = backend.read()
        assert g0.memory_total_bytes == 24576 * MiB
        assert g0.memory_reserved_bytes is None
    assert fake.fake.calls["nvmlDeviceGetMemoryInfo_v2"] == 1
    assert fake.fake.calls["nvmlDeviceGetMemoryInfo"] == 6


def test_gpu_lost_mid_read_keeps_what_was_read(fake: ModuleType, backend: NvmlBackend) -> None:
    backend.read()
    a4000 = fp.rtx_a4000().uuid
    # The A4000 falls off the bus between the memory read and the power read.
    fake.fail("nvmlDeviceGetPowerUsage", fake.NVML_ERROR_GPU_IS_LOST, uuid=a4000)
    g0, g1 = backend.read()
    assert g1.memory_total_bytes == 16376 * MiB
    assert g1.power_watts is None
    assert g0.power_watts == pytest.approx(331.412)
    # The next read looks the devices up again instead of trusting the old handles.
    fake.lose(1)
    count_before = fake.fake.calls["nvmlDeviceGetCount_v2"]
    g0, g1 = backend.read()
    assert fake.fake.calls["nvmlDeviceGetCount_v2"] == count_before + 1
    assert g0.memory_used_bytes == 19213 * MiB
    assert (g1.name, g1.memory_total_bytes) == ("NVIDIA RTX A4000", None)


def test_gpu_that_stays_listed_but_lost_shows_not_available(fake: ModuleType,
                                                            backend: NvmlBackend) -> None:
    backend.read()
    fake.lose(1)
    for _ in range(3):  # old handle first, then no handle at all: the reading keeps its place
        g0, g1 = backend.read()
        assert (g1.index, g1.name, g1.uuid) == (1, "NVIDIA RTX A4000", fp.rtx_a4000().uuid)
        assert (g1.memory_total_bytes, g1.utilization_percent, g1.processes) == (None, None, ())
        assert g0.utilization_percent == 97.0
    # It comes back after a reset: the next read finds it again.
    fake.fake.lost.clear()
    _, g1 = backend.read()
    assert g1.memory_total_bytes == 16376 * MiB


def test_gpu_that_leaves_the_device_list(fake: ModuleType, backend: NvmlBackend) -> None:
    assert len(backend.read()) == 2
    fake.vanish(0)
    backend.read()  # the old handles: the first GPU answers "lost"
    (g,) = backend.read()
    assert (g.index, g.name) == (0, "NVIDIA RTX A4000")
    assert g.memory_total_bytes == 16376 * MiB
    assert backend.status.message == "1 NVIDIA GPU"


def test_steady_reads_do_not_enumerate_or_look_up_names_again(fake: ModuleType,
                                                               backend: NvmlBackend) -> None:
    for _ in range(5):
        backend.read()
    assert fake.fake.calls["nvmlDeviceGetCount_v2"] == 1
    assert fake.fake.calls["nvmlDeviceGetName"] == 2
    # Each pid's name is looked up once while the pid stays on the GPU.
    assert fake.fake.calls["nvmlSystemGetProcessName"] == 4


def test_process_name_comes_from_psutil_for_a_live_pid() -> None:
    gpu = fp.rtx_3090()
    gpu.compute = [(os.getpid(), 512 * MiB)]
    b = NvmlBackend(fp.make_fake_pynvml([gpu]))
    try:
        (g,) = b.read()
        (p,) = [p for p in g.processes if p.pid == os.getpid()]
        me = psutil.Process()
        assert p.name == person_name(me.name(), me.cmdline())  # "pytest", not "python3"
    finally:
        b.close()


def test_unknown_process_name_is_empty(fake: ModuleType) -> None:
    b = NvmlBackend(fp.make_fake_pynvml(process_names={}))
    try:
        g0, _ = b.read()
        assert {p.name for p in g0.processes} == {""}
    finally:
        b.close()


def test_close_ends_the_nvml_session(fake: ModuleType) -> None:
    b = NvmlBackend(fake)
    b.read()
    b.close()
    assert fake.fake.initialised == 0
    assert len(b.read()) == 2  # a read after close starts a new session
    b.close()
    assert fake.fake.initialised == 0


# --- the factory and the null backend --------------------------------------------------------


def test_library_not_found_gives_no_gpu_backend(fake: ModuleType) -> None:
    fake.fail_init(fake.NVML_ERROR_LIBRARY_NOT_FOUND)
    b = make_backend(nvml_module=fake)
    assert isinstance(b, NoGpuBackend)
    assert b.status.backend == "none"
    assert b.status.message == "no NVIDIA GPU found (the NVIDIA driver library is not installed)"
    assert b.read() == ()
    b.close()


def test_driver_without_gpus_gives_no_gpu_backend() -> None:
    fake = fp.make_fake_pynvml([])
    b = make_backend(nvml_module=fake)
    assert isinstance(b, NoGpuBackend)
    assert b.status.message == "no NVIDIA GPU found"
    assert fake.fake.initialised == 0  # the NVML session was closed again


def test_factory_picks_nvml_when_a_gpu_answers(fake: ModuleType) -> None:
    b = make_backend(nvml_module=fake)
    try:
        assert isinstance(b, NvmlBackend)
        assert len(b.read()) == 2
    finally:
        b.close()


def test_factory_on_this_machine() -> None:
    b = make_backend()
    try:
        if isinstance(b, NvmlBackend):
            pytest.skip("this machine has an NVIDIA GPU; tests/gpu covers it")
        assert isinstance(b, NoGpuBackend)
        assert b.status.message and b.status.message.startswith("no NVIDIA GPU found")
        assert b.read() == ()
    finally:
        b.close()


def test_no_gpu_backend_default_message() -> None:
    assert NoGpuBackend().status.to_json() == {
        "backend": "none", "message": "no NVIDIA GPU found",
        "driver_version": None, "cuda_driver_version": None}


# --- simulated GPUs ----------------------------------------------------------------------------


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def training(g: GpuReading):  # type: ignore[no-untyped-def]
    return [p for p in g.processes if p.kind == "compute"]


def test_demo_factory_gives_simulated_gpus() -> None:
    b = make_backend(demo=True)
    assert isinstance(b, SimulatedBackend)
    assert b.status.backend == "simulated"
    assert b.status.message == "simulated GPUs (demo)"
    readings = b.read()
    assert len(readings) == 2
    assert all(g.simulated and "(demo)" in g.name for g in readings)


def test_simulated_is_deterministic_in_the_clock() -> None:
    a = SimulatedBackend(clock=Clock(1_800_000_123.0)).read()
    b = SimulatedBackend(clock=Clock(1_800_000_123.0)).read()
    c = SimulatedBackend(clock=Clock(1_800_000_163.0)).read()
    assert a == b
    assert a != c


def test_simulated_desktop_on_gpu0() -> None:
    (g0, g1) = SimulatedBackend(clock=Clock(1000.0)).read()
    assert g0.name == "Simulated RTX 4070 (demo)"
    assert g0.display_active is True and g1.display_active is False
    desktop = [p for p in g0.processes if p.kind == "graphics"]
    assert {p.name for p in desktop} == {"Xorg", "gnome-shell"}
    assert 560 * MiB < sum(p.used_memory_bytes or 0 for p in desktop) < 640 * MiB
    assert not [p for p in g1.processes if p.kind == "graphics"]


def test_simulated_training_grows_ends_and_restarts() -> None:
    period, gap = 330.0, 30.0  # GPU 0: a 300 s run, then 30 s without the job
    base = 10 * period
    sizes = []
    pids = set()
    for t in (5, 60, 120, 180, 240, 295):
        (g0,) = SimulatedBackend(gpu_count=1, clock=Clock(base + t)).read()
        (proc,) = training(g0)
        sizes.append(proc.used_memory_bytes)
        pids.add(proc.pid)
    assert sizes == sorted(sizes) and sizes[-1] > 4 * sizes[0]
    assert len(pids) == 1
    (ended,) = SimulatedBackend(gpu_count=1, clock=Clock(base + period - gap / 2)).read()
    assert training(ended) == []
    (again,) = SimulatedBackend(gpu_count=1, clock=Clock(base + period + 5)).read()
    (restarted,) = training(again)
    assert restarted.pid not in pids
    assert restarted.used_memory_bytes is not None and restarted.used_memory_bytes < sizes[1]


def test_simulated_readings_are_consistent() -> None:
    for t in range(0, 900, 37):
        for g in SimulatedBackend(gpu_count=3, clock=Clock(5000.0 + t)).read():
            assert g.memory_total_bytes is not None and g.memory_used_bytes is not None
            assert g.memory_free_bytes is not None and g.memory_reserved_bytes is not None
            assert g.memory_free_bytes > 0
            assert (g.memory_used_bytes + g.memory_free_bytes + g.memory_reserved_bytes
                    == g.memory_total_bytes)
            assert sum(p.used_memory_bytes or 0 for p in g.processes) <= g.memory_used_bytes
            assert g.utilization_percent is not None and 0 <= g.utilization_percent <= 100
            assert g.temperature_c is not None and 30 <= g.temperature_c <= 80
            assert g.power_watts is not None and g.power_watts > 0


def test_simulated_load_follows_the_job() -> None:
    base = 20 * 330.0
    (busy,) = SimulatedBackend(gpu_count=1, clock=Clock(base + 250)).read()
    (idle,) = SimulatedBackend(gpu_count=1, clock=Clock(base + 325)).read()
    assert busy.utilization_percent is not None and idle.utilization_percent is not None
    assert busy.utilization_percent > 70 > idle.utilization_percent
    assert busy.power_watts is not None and idle.power_watts is not None
    assert busy.power_watts > 2 * idle.power_watts
    assert busy.temperature_c is not None and idle.temperature_c is not None
    assert busy.temperature_c > idle.temperature_c


def test_simulated_pid_base_and_count() -> None:
    b = SimulatedBackend(gpu_count=1, clock=Clock(100.0), pid_base=50_000)
    (g,) = b.read()
    assert all(50_000 < p.pid < 60_000 for p in g.processes)
    assert SimulatedBackend(gpu_count=0).read() == ()
