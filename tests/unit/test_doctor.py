"""Doctor verdicts from tables of interpreters and NVML readings."""

from __future__ import annotations

import json

import pytest

from trayapp.jobs import cgroups
from trayapp.jobs.doctor import (
    TESTED_BUILDS,
    Check,
    build_cuda,
    diagnose,
    format_report,
    protection_check,
    verdict,
)
from trayapp.jobs.interpreters import Interpreter
from trayapp.readings import GpuReading, GpuStatus

GIB = 1024**3
NVML = GpuStatus(backend="nvml", driver_version="550.54.14", cuda_driver_version="12.4")
NO_GPU = GpuStatus(backend="none", message="no NVIDIA GPU found")


def gpu(index=0):
    return GpuReading(index, "NVIDIA GeForce RTX 3060", None, 12 * GIB, GIB, 11 * GIB)


def interp(**fields):
    base = dict(
        path="/home/u/.venv/bin/python",
        python_version="3.11.9",
        tf_version="2.17.0",
        keras_version="3.5.0",
        is_cuda_build=True,
        cuda_version="12.3",
        cudnn_version="8",
        gpus_seen=1,
    )
    base.update(fields)
    return Interpreter(**base)


def by_name(checks):
    return {c.name: c for c in checks}


def test_a_ready_linux_machine():
    checks = diagnose(interp(), NVML, [gpu()], platform="linux")
    assert verdict(checks) == "ok"
    c = by_name(checks)
    assert "driver 550.54.14, supports CUDA up to 12.4; 1 GPU" in c["NVIDIA driver"].detail
    assert c["Driver and CUDA"].verdict == "ok"
    assert c["GPUs TensorFlow sees"].detail == "1 of 1"


@pytest.mark.parametrize(
    "fields, status, gpus, platform, name, expected, words",
    [
        # No TensorFlow at all.
        (dict(tf_version=None, is_cuda_build=None, gpus_seen=None), NVML, [gpu()], "linux",
         "TensorFlow", "fail", "not installed"),
        # A CPU-only build on a GPU machine.
        (dict(is_cuda_build=False, cuda_version=None, gpus_seen=0), NVML, [gpu()], "linux",
         "TensorFlow build", "fail", "CPU-only build on a machine with 1 NVIDIA GPU"),
        # A CPU build on a machine without GPU is fine.
        (dict(is_cuda_build=False, cuda_version=None, gpus_seen=0), NO_GPU, [], "linux",
         "TensorFlow build", "ok", "CPU build"),
        # TensorFlow sees no GPU while NVML sees one.
        (dict(gpus_seen=0), NVML, [gpu()], "linux", "GPUs TensorFlow sees", "fail",
         "0 GPUs, while NVML sees 1"),
        (dict(gpus_seen=1), NVML, [gpu(0), gpu(1)], "linux", "GPUs TensorFlow sees", "warn",
         "1 of the 2 GPUs"),
        # A driver too old for the build's CUDA major version.
        (dict(tf_version="2.17.0", cuda_version="12.3"),
         GpuStatus("nvml", driver_version="470.82", cuda_driver_version="11.4"), [gpu()],
         "linux", "Driver and CUDA", "fail", "supports CUDA up to 11.4"),
        # Same major, older minor: runs through minor version compatibility.
        (dict(cuda_version="12.5"), NVML, [gpu()], "linux", "Driver and CUDA", "warn",
         "minor version compatibility"),
        # Native Windows after 2.10.
        (dict(is_cuda_build=False, cuda_version=None, gpus_seen=0), NVML, [gpu()], "win32",
         "Windows", "fail", "no GPU support on native Windows"),
        # An interpreter that is not a working Python.
        (dict(python_version=None, error="not found"), NVML, [gpu()], "linux", "Python", "fail",
         "not found"),
        (dict(tf_version="2.15.0", error="TensorFlow does not import: libcudart.so.12"), NVML,
         [gpu()], "linux", "TensorFlow", "fail", "libcudart.so.12"),
    ],
)  # fmt: skip
def test_problems_are_named_with_a_fix(fields, status, gpus, platform, name, expected, words):
    checks = diagnose(interp(**fields), status, gpus, platform=platform)
    check = by_name(checks)[name]
    assert check.verdict == expected
    assert words in check.detail
    if expected == "fail":
        assert check.fix
        assert verdict(checks) == "fail"


def test_the_driver_fix_names_the_minimum_driver():
    status = GpuStatus("nvml", driver_version="470.82", cuda_driver_version="11.4")
    check = by_name(diagnose(interp(), status, [gpu()], platform="linux"))["Driver and CUDA"]
    assert check.fix == "update the NVIDIA driver (CUDA 12 needs driver 525 or newer)"


def test_windows_2_10_still_had_gpu_support():
    checks = diagnose(interp(tf_version="2.10.1", cuda_version="11.2"), NVML, [gpu()], "win32")
    assert "Windows" not in by_name(checks)


def test_a_cuda_version_missing_from_the_build_comes_from_the_tested_table():
    found = interp(tf_version="2.15.1", cuda_version=None)
    assert build_cuda(found) == ("12.2", "TensorFlow's tested build configurations")
    assert TESTED_BUILDS["2.15"] == ("12.2", "8.9")
    check = by_name(diagnose(found, NVML, [gpu()], "linux"))["Driver and CUDA"]
    assert check.verdict == "ok" and "12.2" in check.detail


def test_unknown_stays_unknown():
    # A TensorFlow newer than the table, with no CUDA version in its build info.
    found = interp(tf_version="2.99.0", cuda_version=None)
    check = by_name(diagnose(found, NVML, [gpu()], "linux"))["Driver and CUDA"]
    assert check.verdict == "unknown"
    # The driver's CUDA version unknown.
    status = GpuStatus("nvml", driver_version="550", cuda_driver_version=None)
    check = by_name(diagnose(interp(), status, [gpu()], "linux"))["Driver and CUDA"]
    assert check.verdict == "unknown"
    # No driver at all: nothing to compare.
    checks = by_name(diagnose(interp(gpus_seen=0), NO_GPU, [], "linux"))
    assert checks["NVIDIA driver"].verdict == "unknown"
    assert checks["Driver and CUDA"].verdict == "unknown"
    assert "GPUs TensorFlow sees" not in checks
    # The probe could not count the GPUs.
    checks = by_name(diagnose(interp(gpus_seen=None), NVML, [gpu()], "linux"))
    assert checks["GPUs TensorFlow sees"].verdict == "unknown"


def test_simulated_gpus_are_not_a_driver():
    status = GpuStatus("simulated", message="demo")
    checks = by_name(diagnose(interp(), status, [gpu()], "linux"))
    assert checks["NVIDIA driver"].verdict == "unknown"
    assert "GPUs TensorFlow sees" not in checks  # simulated GPUs are not NVML's


def test_report_and_json():
    checks = diagnose(interp(gpus_seen=0), NVML, [gpu()], platform="linux")
    text = format_report(checks)
    assert "  FAIL  GPUs TensorFlow sees: 0 GPUs, while NVML sees 1" in text
    assert "        fix: TensorFlow did not load CUDA" in text
    assert text.rstrip().endswith("Verdict: not ready; see the fixes.")
    data = json.loads(json.dumps([c.to_json() for c in checks]))
    assert {"name", "verdict", "detail", "fix"} == set(data[0])
    assert all(d["verdict"] in ("ok", "warn", "fail", "unknown") for d in data)


def test_verdict_order():
    assert verdict([Check("a", "ok", ""), Check("b", "unknown", "")]) == "ok"
    assert verdict([Check("a", "warn", ""), Check("b", "ok", "")]) == "warn"
    assert verdict([Check("a", "warn", ""), Check("b", "fail", "")]) == "fail"


def test_the_memory_protection_is_a_check_that_says_which() -> None:
    braked = protection_check(offer=cgroups.Offer(cgroups.V1, "", "/sys/fs/cgroup/x"))
    assert (braked.name, braked.verdict, braked.detail, braked.fix) == \
        ("Memory protection", "ok", "kernel brake (cgroup v1)", None)
    alone = protection_check(offer=cgroups.Offer(cgroups.NONE, "no cgroups on this "
                                                        "system"))
    assert alone.verdict == "ok"  # the guard alone still guards
    assert alone.detail == "none: the guard only (no cgroups on this system)"
    off = protection_check(offer=cgroups.Offer(
        cgroups.NONE, "the kernel brake is off (guard.kernel_brake)"))
    assert off.fix is None
