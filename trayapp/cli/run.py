"""``headroom run``: check the spec, launch the script under the guard (an engine is started when
none runs) and follow it to its end; ``--dry-run`` prints the plan and starts nothing."""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any, Dict, Optional, Tuple

from trayapp import config as configmod
from trayapp.cli.base import EXIT_OK, UsageError, config_file, demo, say, show
from trayapp.cli.follow import Follower
from trayapp.config import Paths
from trayapp.engine.client import EngineClient, EngineError, EngineUnavailable, connect
from trayapp.jobs import cgroups
from trayapp.jobs import spec_values as sv
from trayapp.jobs.options import JobSpec, SpecError, apply_preset, spec_from_cli, validate
from trayapp.jobs.plan import JobProcess, build_launch, format_plan, guard_lines
from trayapp.probes.gpu import make_backend
from trayapp.probes.memory import make_memory_probe
from trayapp.readings import GpuReading
from trayapp.text import one_line

DRY_RUN_ID = "dry-run"


def local_gpus(demo: bool) -> Tuple[GpuReading, ...]:
    """GPU readings from the probes (for a dry run or checks before an engine answers)."""
    backend = make_backend(demo=demo)
    try:
        return tuple(backend.read())
    finally:
        backend.close()


def engine_rlimits(paths: Paths) -> Optional[Dict[str, Any]]:
    """The running engine's resource limits, or this process's when none runs (the engine
    that ``headroom run`` starts takes them from here); None when they cannot be told."""
    try:
        with EngineClient(paths, timeout=2.0) as c:
            limits = c.status().engine.rlimits
    except EngineUnavailable:
        return {name: [soft, hard] for name, soft, hard in sv.own_rlimits()}
    except EngineError:
        return None
    return dict(limits) if limits is not None else None


def cmd_run(args: argparse.Namespace, paths: Paths) -> int:
    try:
        spec = dataclasses.replace(spec_from_cli(args), rlimits=sv.own_rlimits())
    except SpecError as e:
        raise UsageError(one_line(e)) from None
    gpus = local_gpus(demo(args))
    try:
        warnings = validate(spec, gpus, check_paths=True)
    except SpecError as e:
        raise UsageError(one_line(e)) from None
    if getattr(args, "dry_run", False):
        return _dry_run(spec, paths, gpus)
    for w in warnings:
        say(f"warning: {w}")
    client = connect(paths, start=True, demo=demo(args), config_file=config_file(args))
    try:
        job = client.job_start(spec.to_json(), environ=dict(os.environ))
        follower = Follower(client, paths, job)
        follower.engine_options = {"demo": demo(args), "config_file": config_file(args)}
        return follower.run()
    finally:
        client.close()


def _dry_run(spec: JobSpec, paths: Paths, gpus: Tuple[GpuReading, ...]) -> int:
    # The engine reads the same file: the priority, the log cap and the guard it would give
    # the job, and applies the preset against the machine's RAM (a budget) as here.
    config = configmod.load(paths.config_file)
    process = dataclasses.replace(
        JobProcess.from_config(config), engine_rlimits=engine_rlimits(paths)
    )
    if spec.preset:
        try:
            spec = apply_preset(
                spec, spec.preset, gpus, ram_total_bytes=make_memory_probe().read().total_bytes
            )
        except SpecError as e:
            raise UsageError(one_line(e)) from None
    folder = paths.jobs_dir / DRY_RUN_ID
    try:
        plan = build_launch(
            spec,
            job_id=DRY_RUN_ID,
            address=paths.job_address(DRY_RUN_ID),
            keyfile=str(folder / "key"),
            gpus=gpus,
            base_env=dict(os.environ),
            process=process,
            log_path=str(folder / "log"),
        )
    except ValueError as e:
        raise UsageError(one_line(e)) from None
    show(
        format_plan(
            plan,
            guard_lines(spec, config.values)
            + [cgroups.plan_line(bool(config["guard.kernel_brake"]), spec.ram_budget_mb)],
        )
    )
    return EXIT_OK
