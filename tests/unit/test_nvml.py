"""The NVML wrapper: lazy init, shutdown at exit, None on errors, failures logged once,
versioned fallbacks. NVML itself is the fake built from real readings."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from tests.fixtures import load_fake_pynvml
from trayapp.probes import nvml as nvml_mod
from trayapp.probes.nvml import Nvml, init_failure_message

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REPO = FIXTURES.parents[1]


fake_pynvml = load_fake_pynvml()
COMPUTE = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)


@pytest.fixture
def fake() -> ModuleType:
    return fake_pynvml.make_fake_pynvml()


@pytest.fixture
def nv(fake: ModuleType):
    n = Nvml(fake)
    yield n
    n.shutdown()


def test_init_is_lazy_and_happens_once(fake: ModuleType, nv: Nvml) -> None:
    assert fake.fake.calls["nvmlInit"] == 0
    assert nv.call("nvmlDeviceGetCount") == 2
    assert nv.call("nvmlSystemGetDriverVersion") == "550.54.14"
    assert fake.fake.calls["nvmlInit"] == 1


def test_shutdown_ends_the_session_once(fake: ModuleType) -> None:
    n = Nvml(fake)
    assert n.call("nvmlDeviceGetCount") == 2
    n.shutdown()
    n.shutdown()
    assert fake.fake.calls["nvmlShutdown"] == 1
    assert fake.fake.initialised == 0


def test_shutdown_runs_at_interpreter_exit() -> None:
    # A handler registered before NVML starts runs after the wrapper's own (atexit is LIFO).
    fake_path = str(FIXTURES / "fake_pynvml.py")
    code = textwrap.dedent(
        f"""
        import atexit, importlib.util, sys
        spec = importlib.util.spec_from_file_location("fake_pynvml", {fake_path!r})
        fp = sys.modules["fake_pynvml"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fp)
        fake = fp.make_fake_pynvml()
        atexit.register(lambda: print("shutdowns", fake.fake.calls["nvmlShutdown"],
                                      "open", fake.fake.initialised))
        from trayapp.probes.nvml import Nvml
        n = Nvml(fake)
        assert n.call("nvmlDeviceGetCount") == 2
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "shutdowns 1 open 0"


def test_error_gives_none_and_is_logged_once(fake: ModuleType, nv: Nvml,
                                             caplog: pytest.LogCaptureFixture,
                                             capsys: pytest.CaptureFixture) -> None:
    fake.fail("nvmlDeviceGetPowerUsage", fake.NVML_ERROR_NOT_SUPPORTED)
    handle = nv.call("nvmlDeviceGetHandleByIndex", 0)
    with caplog.at_level(logging.DEBUG, logger="headroom.nvml"):
        assert nv.call("nvmlDeviceGetPowerUsage", handle) is None
        assert nv.call("nvmlDeviceGetPowerUsage", handle) is None
        assert nv.call("nvmlDeviceGetPowerUsage", handle) is None
    records = [r for r in caplog.records if "nvmlDeviceGetPowerUsage" in r.getMessage()]
    assert len(records) == 1
    assert records[0].levelno == logging.INFO  # "not supported" is a fact, not a fault
    assert "Not Supported" in records[0].getMessage()
    assert capsys.readouterr().out == ""
    assert nv.last_error == fake.NVML_ERROR_NOT_SUPPORTED
    assert not nv.lost


def test_lost_gpu_sets_the_flag_and_warns(fake: ModuleType, nv: Nvml,
                                         caplog: pytest.LogCaptureFixture) -> None:
    handle = nv.call("nvmlDeviceGetHandleByIndex", 1)
    fake.lose(1)
    with caplog.at_level(logging.INFO, logger="headroom.nvml"):
        assert nv.call("nvmlDeviceGetTemperature", handle, 0) is None
    assert nv.lost
    assert nv.last_error == fake.NVML_ERROR_GPU_IS_LOST
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


def test_success_clears_last_error(fake: ModuleType, nv: Nvml) -> None:
    fake.fail("nvmlSystemGetProcessName", fake.NVML_ERROR_NOT_FOUND)
    assert nv.call("nvmlSystemGetProcessName", 1) is None
    assert nv.last_error == fake.NVML_ERROR_NOT_FOUND
    assert nv.call("nvmlDeviceGetCount") == 2
    assert nv.last_error is None


def test_first_falls_back_when_the_driver_lacks_v3_and_remembers(fake: ModuleType,
                                                                 nv: Nvml) -> None:
    fake.fake.driver_lacks.add("nvmlDeviceGetComputeRunningProcesses_v3")
    handle = nv.call("nvmlDeviceGetHandleByIndex", 0)
    for _ in range(3):
        procs = nv.first(COMPUTE, handle)
        assert [(p.pid, p.usedGpuMemory) for p in procs] == [
            (fake_pynvml.PID_TRAIN, 18640 * 1024**2)
        ]
    assert fake.fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 1
    assert fake.fake.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 3


def test_first_uses_v1_with_bindings_that_lack_versioned_functions() -> None:
    fake = fake_pynvml.make_fake_pynvml(old_bindings=True)
    nv = Nvml(fake)
    try:
        handle = nv.call("nvmlDeviceGetHandleByIndex", 0)
        procs = nv.first(COMPUTE, handle)
        assert [p.pid for p in procs] == [fake_pynvml.PID_TRAIN]
        assert fake.fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 1
    finally:
        nv.shutdown()


def test_first_gives_none_when_no_version_exists(fake: ModuleType, nv: Nvml,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    # New bindings on an old driver: _v3 and _v2 are missing, and the unversioned call
    # raises the bindings' version-mismatch error (not an NVMLError).
    fake.fake.driver_lacks.update({"nvmlDeviceGetComputeRunningProcesses_v3",
                                   "nvmlDeviceGetComputeRunningProcesses_v2"})
    handle = nv.call("nvmlDeviceGetHandleByIndex", 0)
    with caplog.at_level(logging.INFO, logger="headroom.nvml"):
        assert nv.first(COMPUTE, handle) is None
        assert nv.first(COMPUTE, handle) is None
    assert len([r for r in caplog.records if r.levelno >= logging.INFO]) == 1


def test_first_does_not_fall_back_on_other_errors(fake: ModuleType, nv: Nvml) -> None:
    fake.fail("nvmlDeviceGetComputeRunningProcesses_v3", fake.NVML_ERROR_NO_PERMISSION)
    handle = nv.call("nvmlDeviceGetHandleByIndex", 0)
    assert nv.first(COMPUTE, handle) is None
    assert fake.fake.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 0


def test_missing_function_in_bindings_gives_none(nv: Nvml) -> None:
    assert nv.call("nvmlDeviceGetSomethingFromTheFuture", 0) is None
    assert nv.last_error == nvml_mod.NVML_ERROR_FUNCTION_NOT_FOUND


def test_unexpected_exception_in_bindings_gives_none(fake: ModuleType, nv: Nvml) -> None:
    def broken(handle):  # a binding that trips over a driver string it cannot decode
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    fake.nvmlDeviceGetName = broken
    handle = nv.call("nvmlDeviceGetHandleByIndex", 0)
    assert nv.call("nvmlDeviceGetName", handle) is None
    assert nv.call("nvmlDeviceGetUUID", handle) == "GPU-8d6a4c1e-2f7b-9a35-0c4d-6e1f2a3b4c5d"


def test_init_failure_is_remembered_with_a_message(fake: ModuleType) -> None:
    fake.fail_init(fake.NVML_ERROR_LIBRARY_NOT_FOUND)
    nv = Nvml(fake)
    assert nv.call("nvmlDeviceGetCount") is None
    assert nv.call("nvmlDeviceGetCount") is None
    assert not nv.init()
    assert fake.fake.calls["nvmlInit"] == 1
    assert nv.init_error == "no NVIDIA GPU found (the NVIDIA driver library is not installed)"
    nv.shutdown()
    assert fake.fake.calls["nvmlShutdown"] == 0


def test_init_failure_messages(fake: ModuleType) -> None:
    assert init_failure_message(fake.NVMLError(fake.NVML_ERROR_DRIVER_NOT_LOADED)) == (
        "no NVIDIA GPU found (the NVIDIA driver is not loaded)")
    assert init_failure_message(ImportError("No module named 'pynvml'")) == (
        "no NVIDIA GPU found (nvidia-ml-py is not installed)")
    assert init_failure_message(fake.NVMLError(fake.NVML_ERROR_LIB_RM_VERSION_MISMATCH)) == (
        "NVIDIA driver error: Lib Rm Version Mismatch")


def test_bindings_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes "import pynvml" fail
    nv = Nvml()
    assert nv.call("nvmlDeviceGetCount") is None
    assert nv.init_error == "no NVIDIA GPU found (nvidia-ml-py is not installed)"


def test_real_bindings_without_a_driver() -> None:
    nv = Nvml()
    try:
        if nv.init():
            pytest.skip("this machine has an NVIDIA driver; tests/gpu covers it")
        assert nv.init_error is not None and nv.init_error.startswith("no NVIDIA GPU found")
        assert nv.call("nvmlDeviceGetCount") is None
    finally:
        nv.shutdown()
