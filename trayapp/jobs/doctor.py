"""``headroom doctor``: can this interpreter's TensorFlow use this machine's GPUs? A verdict.

Each check compares what the interpreter's probe found (``interpreters.probe``) with what NVML
reports: the driver and the newest CUDA it supports, the TensorFlow build's CUDA version, and the
GPUs TensorFlow sees. What cannot be known stays "unknown"; nothing is guessed.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from trayapp import config as configmod
from trayapp.jobs import cgroups
from trayapp.jobs.interpreters import Interpreter
from trayapp.jsonvalue import JSONObject
from trayapp.readings import GpuReading, GpuStatus

VERDICTS = ("ok", "warn", "fail", "unknown")

# TensorFlow's tested GPU build configurations (tensorflow.org/install/source#gpu, Linux):
# version -> (CUDA, cuDNN). Used only when the build itself does not say (its build info does).
TESTED_BUILDS: Dict[str, Tuple[str, str]] = {
    "2.18": ("12.5", "9.3"),
    "2.17": ("12.3", "8.9"),
    "2.16": ("12.3", "8.9"),
    "2.15": ("12.2", "8.9"),
    "2.14": ("11.8", "8.7"),
    "2.13": ("11.8", "8.6"),
    "2.12": ("11.8", "8.6"),
    "2.11": ("11.2", "8.1"),
    "2.10": ("11.2", "8.1"),
    "2.9": ("11.2", "8.1"),
    "2.8": ("11.2", "8.1"),
    "2.7": ("11.2", "8.1"),
    "2.6": ("11.2", "8.1"),
    "2.5": ("11.2", "8.1"),
    "2.4": ("11.0", "8.0"),
    "2.3": ("10.1", "7.6"),
    "2.2": ("10.1", "7.6"),
    "2.1": ("10.1", "7.6"),
    "2.0": ("10.0", "7.4"),
}

# The oldest driver that runs a CUDA major version (NVIDIA's CUDA compatibility guide, minor
# version compatibility table).
MIN_DRIVER: Dict[int, str] = {
    11: "450.80.02 (Linux) or 452.39 (Windows)",
    12: "525",
    13: "580",
}

# The last TensorFlow with GPU support on native Windows (release notes of 2.11).
LAST_NATIVE_WINDOWS_GPU = (2, 10)


@dataclass(frozen=True)
class Check:
    name: str
    verdict: str  # "ok" | "warn" | "fail" | "unknown"
    detail: str
    fix: Optional[str] = None

    def to_json(self) -> JSONObject:
        return asdict(self)


def _version(text: Optional[str]) -> Optional[Tuple[int, ...]]:
    if not text:
        return None
    numbers = []
    for part in str(text).split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        numbers.append(int(digits))
        if digits != part:
            break
    return tuple(numbers) or None


def _major_minor(text: Optional[str]) -> Optional[str]:
    v = _version(text)
    if v is None:
        return None
    return ".".join(str(x) for x in v[:2])


def build_cuda(interp: Interpreter) -> Tuple[Optional[str], str]:
    """(CUDA version of the interpreter's TensorFlow build, where that came from)."""
    if interp.cuda_version:
        return str(interp.cuda_version), "its build info"
    tested = TESTED_BUILDS.get(_major_minor(interp.tf_version) or "")
    if tested:
        return tested[0], "TensorFlow's tested build configurations"
    return None, ""


def _pip_install(interp: Interpreter, platform: str) -> str:
    extra = "tensorflow[and-cuda]" if platform.startswith("linux") else "tensorflow"
    return f"{interp.path} -m pip install '{extra}'"


def diagnose(
    interp: Interpreter,
    gpu_status: GpuStatus,
    gpus: Sequence[GpuReading],
    platform: Optional[str] = None,
) -> List[Check]:
    """The checks, in reading order. ``platform`` defaults to ``sys.platform``."""
    platform = platform or sys.platform
    real = gpu_status.backend == "nvml"
    n_gpus = len(gpus) if real else 0
    checks = [_driver_check(gpu_status, gpus, real, n_gpus)]
    more = _python_and_tensorflow(interp, platform)
    checks.extend(more)
    if more[-1].verdict != "ok":
        return checks  # nothing more can be checked of this interpreter
    tf = _version(interp.tf_version) or (0,)

    # Native Windows has had no TensorFlow GPU support since 2.11.
    windows_no_gpu = platform.startswith("win") and tf[:2] > LAST_NATIVE_WINDOWS_GPU
    if windows_no_gpu and n_gpus:
        checks.append(
            Check(
                "Windows",
                "fail",
                f"TensorFlow {interp.tf_version} has no GPU support on native Windows "
                "(2.10 was the last with it)",
                "run the training in WSL2 (install TensorFlow there with "
                "pip install 'tensorflow[and-cuda]'), or use TensorFlow 2.10 on Windows",
            )
        )
    cuda, source = build_cuda(interp)
    checks.append(_build_check(interp, platform, n_gpus, windows_no_gpu, cuda, source))
    # The driver against the build.
    if interp.is_cuda_build is True and not windows_no_gpu:
        checks.append(_driver_against_build(interp, gpu_status, real, cuda, source))
    if n_gpus:
        checks.append(_gpus_seen_check(interp, platform, n_gpus, windows_no_gpu))
    return checks


def _driver_check(
    gpu_status: GpuStatus, gpus: Sequence[GpuReading], real: bool, n_gpus: int
) -> Check:
    """The NVIDIA driver, as NVML reports it."""
    if real:
        names = ", ".join(sorted({g.name for g in gpus})) or "no GPU listed"
        return Check(
            "NVIDIA driver",
            "ok",
            f"driver {gpu_status.driver_version or 'n/a'}, supports CUDA up to "
            f"{gpu_status.cuda_driver_version or 'n/a'}; {n_gpus} GPU"
            + ("" if n_gpus == 1 else "s")
            + f" ({names})",
        )
    if gpu_status.backend == "simulated":
        return Check("NVIDIA driver", "unknown", "simulated GPUs (--demo): no real driver to check")
    return Check(
        "NVIDIA driver",
        "unknown",
        gpu_status.message or "no NVIDIA GPU or driver found",
        "if this machine has an NVIDIA GPU, install NVIDIA's driver "
        "(nvidia-smi should then list the GPU)",
    )


def _python_and_tensorflow(interp: Interpreter, platform: str) -> List[Check]:
    """The interpreter, then its TensorFlow; the last check is "ok" only when TensorFlow
    imports (the rest can be checked then)."""
    if interp.python_version is None or (interp.error and "too old" in interp.error):
        return [
            Check(
                "Python",
                "fail",
                f"{interp.path}: {interp.error or 'not a working Python'}",
                "choose another interpreter with --python",
            ),
            Check("TensorFlow", "unknown", "the interpreter could not be checked"),
        ]
    python = Check("Python", "ok", f"Python {interp.python_version} at {interp.path}")
    if interp.error and interp.error.startswith("TensorFlow does not import"):
        return [
            python,
            Check(
                "TensorFlow",
                "fail",
                interp.error
                + (f" (TensorFlow {interp.tf_version} is installed)" if interp.tf_version else ""),
                f"reinstall it: {interp.path} -m pip install --force-reinstall tensorflow",
            ),
        ]
    if interp.tf_version is None:
        return [
            python,
            Check(
                "TensorFlow",
                "fail",
                f"TensorFlow is not installed for {interp.path}",
                f"install it: {_pip_install(interp, platform)}",
            ),
        ]
    keras = f" with Keras {interp.keras_version}" if interp.keras_version else ""
    return [python, Check("TensorFlow", "ok", f"TensorFlow {interp.tf_version}{keras}")]


def _build_check(
    interp: Interpreter,
    platform: str,
    n_gpus: int,
    windows_no_gpu: bool,
    cuda: Optional[str],
    source: str,
) -> Check:
    """The TensorFlow build: CPU only, or the CUDA it was built for."""
    if interp.is_cuda_build is False:
        if n_gpus and not windows_no_gpu:
            return Check(
                "TensorFlow build",
                "fail",
                f"a CPU-only build on a machine with {n_gpus} NVIDIA GPU"
                + ("" if n_gpus == 1 else "s")
                + ": training runs on the CPU",
                f"install the GPU build: {_pip_install(interp, platform)}",
            )
        return Check("TensorFlow build", "ok", "CPU build")
    if interp.is_cuda_build is True:
        detail = "CUDA build"
        if cuda:
            detail = f"CUDA {cuda} build (from {source})"
            if interp.cudnn_version:
                detail = f"CUDA {cuda} / cuDNN {interp.cudnn_version} build (from {source})"
        return Check("TensorFlow build", "ok", detail)
    return Check("TensorFlow build", "unknown", "the build's CUDA support is unknown")


def _gpus_seen_check(
    interp: Interpreter, platform: str, n_gpus: int, windows_no_gpu: bool
) -> Check:
    """What TensorFlow sees against NVML's ``n_gpus``."""
    name = "GPUs TensorFlow sees"
    if interp.gpus_seen is None:
        return Check(name, "unknown", "the probe could not count them")
    if interp.gpus_seen == 0:
        if interp.is_cuda_build is False or windows_no_gpu:
            fix = "see the checks above"
        else:
            fix = (
                "TensorFlow did not load CUDA: see its log from "
                f'{interp.path} -c "import tensorflow as tf; '
                "print(tf.config.list_physical_devices('GPU'))\""
            )
            if platform.startswith("linux"):
                fix += f"; the pip wheels bring CUDA: {_pip_install(interp, platform)}"
        return Check(name, "fail", f"0 GPUs, while NVML sees {n_gpus}", fix)
    if interp.gpus_seen < n_gpus:
        return Check(
            name,
            "warn",
            f"{interp.gpus_seen} of the {n_gpus} GPUs NVML sees",
            "check CUDA_VISIBLE_DEVICES in the environment",
        )
    return Check(name, "ok", f"{interp.gpus_seen} of {n_gpus}")


def _driver_against_build(
    interp: Interpreter, status: GpuStatus, real: bool, cuda: Optional[str], source: str
) -> Check:
    name = "Driver and CUDA"
    if not real:
        return Check(name, "unknown", "no NVIDIA driver reading to compare with the CUDA build")
    driver = _version(status.cuda_driver_version)
    build = _version(cuda)
    if driver is None or build is None:
        what = "the driver's CUDA version" if driver is None else "the build's CUDA version"
        return Check(name, "unknown", f"{what} is unknown")
    tf = interp.tf_version
    if driver[0] < build[0]:
        need = MIN_DRIVER.get(build[0])
        fix = "update the NVIDIA driver"
        fix += f" (CUDA {build[0]} needs driver {need} or newer)" if need else ""
        return Check(
            name,
            "fail",
            f"the driver supports CUDA up to {status.cuda_driver_version}; TensorFlow {tf} is "
            f"built for CUDA {cuda} ({source})",
            fix,
        )
    if driver[0] == build[0] and driver[:2] < build[:2]:
        return Check(
            name,
            "warn",
            f"the driver supports CUDA up to {status.cuda_driver_version}, TensorFlow {tf} is "
            f"built for CUDA {cuda}: it runs through CUDA's minor version compatibility, with a "
            "limited feature set",
            "update the NVIDIA driver for full support",
        )
    return Check(
        name,
        "ok",
        f"the driver supports CUDA up to {status.cuda_driver_version}; TensorFlow {tf} is built "
        f"for CUDA {cuda}",
    )


def protection_check(
    config_file: Optional[Path] = None, offer: Optional[cgroups.Offer] = None
) -> Check:
    """What guards a job here besides the guard (``cgroups``), as a check: ok either way (the
    guard alone still guards), with how to get the kernel brake where it is missing. The
    setting ``guard.kernel_brake`` is read from ``config_file``; ``offer``: the machine's,
    else found by asking (nothing is made)."""
    if offer is None:
        enabled = True
        if config_file is not None:
            try:
                enabled = bool(configmod.load(config_file)["guard.kernel_brake"])
            except Exception:  # a config that cannot be read: its own check says so
                enabled = True
        offer = cgroups.detect(enabled=enabled, probe=False)
    fix = None
    if not offer.brakes and sys.platform.startswith("linux") and "is off" not in offer.why:
        fix = (
            "on cgroup v2, log in to a systemd session whose user manager "
            "(user@UID.service) has the memory controller delegated; on cgroup v1, run the "
            "engine where it may make child memory cgroups (as root or in a delegated "
            "cgroup); until then the guard alone guards jobs"
        )
    return Check("Memory protection", "ok", offer.words, fix)


def verdict(checks: Sequence[Check]) -> str:
    """ "fail" if any check failed, else "warn" if any warned, else "ok"."""
    found = {c.verdict for c in checks}
    for v in ("fail", "warn"):
        if v in found:
            return v
    return "ok"


_LABELS = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "unknown": "?"}
_VERDICT_LINES = {
    "ok": "Verdict: ready.",
    "warn": "Verdict: usable, with warnings.",
    "fail": "Verdict: not ready; see the fixes.",
}


def format_report(checks: Sequence[Check]) -> str:
    """The checks as text, one per line with its fix below, and the verdict last."""
    lines = []
    for c in checks:
        lines.append(f"  {_LABELS.get(c.verdict, c.verdict):<5} {c.name}: {c.detail}")
        if c.fix:
            lines.append(f"        fix: {c.fix}")
    lines.append(_VERDICT_LINES[verdict(checks)])
    return "\n".join(lines) + "\n"
