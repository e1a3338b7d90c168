"""``headroom doctor``: the driver, CUDA and the TensorFlow build of the interpreter a job would
run in, checked against each other; exit 1 when a check fails."""

from __future__ import annotations

import argparse
import json
import os
from typing import Tuple

from trayapp.cli.base import EXIT_FAILED, EXIT_OK, UsageError, demo, show
from trayapp.config import Paths
from trayapp.engine.client import EngineClient, EngineUnavailable
from trayapp.jobs import doctor, interpreters
from trayapp.jobs.options import SpecError, resolve_python
from trayapp.probes.gpu import make_backend
from trayapp.readings import GpuReading, GpuStatus
from trayapp.text import one_line

ENGINE_TIMEOUT_SECONDS = 5.0


def machine_gpus(paths: Paths, demo: bool) -> Tuple[GpuStatus, Tuple[GpuReading, ...]]:
    """The GPU status from the engine when one runs, else read from the probes now."""
    try:
        with EngineClient(paths, timeout=ENGINE_TIMEOUT_SECONDS) as client:
            status = client.status()
        return status.gpu_status, status.gpus
    except EngineUnavailable:
        pass
    backend = make_backend(demo=demo)
    try:
        return backend.status, tuple(backend.read())
    finally:
        backend.close()


def _python(args: argparse.Namespace) -> str:
    """The interpreter to check: ``--python``, else the one a script in this folder gets."""
    python = args.python
    if not python:
        # As for a script in this folder: a venv here (or just above), else this Python.
        return interpreters.default_python(os.path.join(os.getcwd(), "script.py"))
    try:
        python = os.path.abspath(resolve_python(python))
    except SpecError as e:
        raise UsageError(one_line(e)) from None
    if not os.path.exists(python):
        raise UsageError(f"--python: not found: {python}")
    return python


def cmd_doctor(args: argparse.Namespace, paths: Paths) -> int:
    python = _python(args)
    gpu_status, gpus = machine_gpus(paths, demo(args))
    interp = interpreters.probe(python, cache_dir=paths.data_dir / "cache")
    checks = doctor.diagnose(interp, gpu_status, gpus)
    checks.append(doctor.protection_check(paths.config_file))
    verdict = doctor.verdict(checks)
    if args.json:
        print(
            json.dumps(
                {
                    "python": interp.to_json(),
                    "verdict": verdict,
                    "checks": [c.to_json() for c in checks],
                }
            )
        )
    else:
        show(doctor.format_report(checks), end="")
    return EXIT_FAILED if verdict == "fail" else EXIT_OK
