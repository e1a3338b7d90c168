"""The NVML backend against real NVIDIA hardware, checked with nvidia-smi and a real CUDA
process. Skipped unless NVML finds a GPU. Run with ``tests/gpu/run_on_device.sh``."""

from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
import sys
import textwrap
import time
from typing import Dict, Iterator, List, Optional, Set

import pytest

from trayapp.probes.gpu import NvmlBackend, make_backend
from trayapp.probes.processes import tree_memory
from trayapp.readings import GpuProcess

MiB = 1024**2
GiB = 1024**3
ALLOC_BYTES = 2 * GiB


def _gpu_backend() -> Optional[NvmlBackend]:
    b = make_backend()
    if isinstance(b, NvmlBackend):
        return b
    b.close()
    return None


_BACKEND = _gpu_backend()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_BACKEND is None, reason="NVML finds no NVIDIA GPU on this machine"),
]


@pytest.fixture(scope="module")
def backend() -> Iterator[NvmlBackend]:
    assert _BACKEND is not None
    yield _BACKEND
    _BACKEND.close()


def nvidia_smi(*args: str) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        pytest.skip("nvidia-smi is not on PATH")
    return subprocess.run([exe, *args], capture_output=True, text=True, check=True,
                          timeout=60).stdout


def _num(text: str) -> Optional[float]:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def smi_gpus() -> Dict[str, Dict[str, object]]:
    fields = ("index,name,uuid,memory.total,memory.used,memory.free,utilization.gpu,"
              "temperature.gpu,power.draw")
    out = nvidia_smi(f"--query-gpu={fields}", "--format=csv,noheader,nounits")
    rows = {}
    for row in csv.reader(io.StringIO(out), skipinitialspace=True):
        if not row:
            continue
        index, name, uuid, total, used, free, util, temp, power = (c.strip() for c in row)
        rows[uuid] = dict(index=int(index), name=name, total=_num(total), used=_num(used),
                          free=_num(free), util=_num(util), temp=_num(temp), power=_num(power))
    return rows


def smi_compute_pids() -> Dict[int, Optional[float]]:
    out = nvidia_smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    pids = {}
    for row in csv.reader(io.StringIO(out), skipinitialspace=True):
        if len(row) >= 2 and row[0].strip().isdigit():
            pids[int(row[0])] = _num(row[1])
    return pids


def in_nested_pid_namespace() -> bool:
    """NVML reports host pids; inside a pid namespace they differ from ours."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return len(line.split()) > 2
    except OSError:
        pass
    return False


def all_processes(readings: tuple) -> List[GpuProcess]:
    return [p for g in readings for p in g.processes]


# --- device readings -------------------------------------------------------------------------


def test_status_matches_nvidia_smi(backend: NvmlBackend) -> None:
    st = backend.status
    assert st.backend == "nvml"
    driver = nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader").split()[0]
    assert st.driver_version == driver
    m = re.search(r"CUDA Version:\s*([0-9]+\.[0-9]+)", nvidia_smi())
    if m is None:
        pytest.skip("nvidia-smi does not print the CUDA version here")
    assert st.cuda_driver_version == m.group(1)


def test_readings_match_nvidia_smi(backend: NvmlBackend) -> None:
    readings = backend.read()
    smi = smi_gpus()
    assert len(readings) == len(smi)
    for g in readings:
        assert g.uuid in smi, f"GPU {g.index} ({g.uuid}) not listed by nvidia-smi"
        s = smi[g.uuid]
        assert g.name == s["name"]
        assert g.index == s["index"]
        assert g.memory_total_bytes is not None and g.memory_used_bytes is not None
        assert g.memory_free_bytes is not None
        assert abs(g.memory_total_bytes / MiB - s["total"]) <= 1  # type: ignore[operator]
        # Nothing else runs on the GPU during the test; 64 MiB covers drift between the reads.
        tol = 64.0
        assert abs(g.memory_used_bytes / MiB - s["used"]) <= tol  # type: ignore[operator]
        assert abs(g.memory_free_bytes / MiB - s["free"]) <= tol  # type: ignore[operator]
        if s["util"] is not None:
            assert g.utilization_percent is not None
            assert abs(g.utilization_percent - s["util"]) <= 30  # type: ignore[operator]
        if s["temp"] is not None:
            assert g.temperature_c is not None
            assert abs(g.temperature_c - s["temp"]) <= 3  # type: ignore[operator]
        if s["power"] is not None:
            assert g.power_watts is not None
            assert abs(g.power_watts - s["power"]) <= max(30.0, 0.25 * s["power"])  # type: ignore
        assert g.simulated is False


def test_memory_adds_up(backend: NvmlBackend) -> None:
    for g in backend.read():
        assert g.memory_total_bytes and g.memory_used_bytes is not None
        assert g.memory_free_bytes is not None
        reserved = g.memory_reserved_bytes or 0
        parts = g.memory_used_bytes + g.memory_free_bytes + reserved
        assert abs(parts - g.memory_total_bytes) <= max(64 * MiB, g.memory_total_bytes // 100)


def test_repeated_reads_are_stable(backend: NvmlBackend) -> None:
    first = backend.read()
    for _ in range(20):
        again = backend.read()
        assert [(g.index, g.uuid, g.name, g.memory_total_bytes) for g in again] == [
            (g.index, g.uuid, g.name, g.memory_total_bytes) for g in first]
        for g in again:
            assert g.uuid is not None and g.uuid.startswith(("GPU-", "MIG-"))
            for p in g.processes:
                assert p.used_memory_bytes is None or p.used_memory_bytes > 0


# --- a real CUDA process ---------------------------------------------------------------------

# Allocates and touches N bytes on GPU 0 with PyTorch (or CuPy), then waits on stdin.
CUDA_CHILD = textwrap.dedent(
    """
    import sys
    n = int(sys.argv[1])
    try:
        import torch
        x = torch.empty(n, dtype=torch.uint8, device="cuda")
        x.fill_(1)
        torch.cuda.synchronize()
    except ImportError:
        try:
            import cupy
        except ImportError:
            print("no-cuda-library", flush=True)
            sys.exit(3)
        x = cupy.ones(n, dtype=cupy.uint8)
        cupy.cuda.Device().synchronize()
    print("ready", flush=True)
    sys.stdin.read()
    """
)


@pytest.fixture(scope="module")
def cuda_child(backend: NvmlBackend) -> Iterator[subprocess.Popen]:
    before: Set[int] = {p.pid for p in all_processes(backend.read())}
    child = subprocess.Popen([sys.executable, "-c", CUDA_CHILD, str(ALLOC_BYTES)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        if line == "no-cuda-library":
            pytest.skip("neither PyTorch nor CuPy is installed for this Python")
        assert line == "ready", f"CUDA child failed (exit {child.poll()})"
        child.before = before  # type: ignore[attr-defined]
        yield child
    finally:
        if child.poll() is None:
            assert child.stdin is not None
            child.stdin.close()
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(10)
        for pipe in (child.stdin, child.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()


def _wait_for(backend: NvmlBackend, found, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    readings: tuple = ()
    while time.monotonic() < deadline:
        readings = backend.read()
        hit = found(readings)
        if hit:
            return hit, readings
        time.sleep(0.25)
    return None, readings


def test_cuda_process_vram_is_seen(backend: NvmlBackend, cuda_child: subprocess.Popen) -> None:
    if not smi_compute_pids():
        pytest.skip("the driver lists no compute processes here (no access to host pids)")
    if in_nested_pid_namespace():
        before = cuda_child.before  # type: ignore[attr-defined]

        def found(rs: tuple) -> List[GpuProcess]:
            return [p for p in all_processes(rs) if p.pid not in before
                    and (p.used_memory_bytes or 0) >= ALLOC_BYTES]
    else:
        def found(rs: tuple) -> List[GpuProcess]:
            return [p for p in all_processes(rs) if p.pid == cuda_child.pid]
    hits, readings = _wait_for(backend, found)
    assert hits, f"the CUDA child is not among {all_processes(readings)}"
    p = hits[0]
    assert p.kind == "compute"
    assert p.used_memory_bytes is not None and p.used_memory_bytes >= ALLOC_BYTES
    assert p.name.startswith("python") or p.name == ""


def test_tree_memory_maps_vram_onto_the_process(backend: NvmlBackend,
                                                cuda_child: subprocess.Popen) -> None:
    if in_nested_pid_namespace():
        pytest.skip("NVML reports host pids, which do not match pids in this namespace")
    if not smi_compute_pids():
        pytest.skip("the driver lists no compute processes here (no access to host pids)")
    hit, readings = _wait_for(backend, lambda rs: any(
        p.pid == cuda_child.pid for p in all_processes(rs)))
    assert hit
    m = tree_memory(cuda_child.pid, readings)
    assert m is not None
    assert m.vram_bytes is not None and m.vram_bytes >= ALLOC_BYTES


def test_gpu_memory_used_grows_with_the_allocation(backend: NvmlBackend,
                                                   cuda_child: subprocess.Popen) -> None:
    readings: tuple = backend.read()
    used = [g.memory_used_bytes for g in readings if g.memory_used_bytes is not None]
    assert used and max(used) >= ALLOC_BYTES
