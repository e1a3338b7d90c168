"""``headroom jobs`` and the job actions (``pause``, ``resume``, ``park``, ``stop``), and how a
job reads in the terminal: its progress line (``run``, ``status``), its row in the table, its
state after an action."""

from __future__ import annotations

import argparse
import json
from typing import Iterable

from trayapp import formats, vocab
from trayapp.cli.base import EXIT_OK, config_file, demo
from trayapp.config import Paths
from trayapp.engine.client import connect
from trayapp.jobs.record import JobRecord, records
from trayapp.vocab import JobState as S

NAME_WIDTH = 24  # a longer name is cut in the table
# Ended states whose reason is shown after the state in an action's answer.
_WITH_REASON = vocab.ENDED - {S.FINISHED.value} | vocab.PARKED


def state_text(job: JobRecord) -> str:
    """The state, and how a paused job is paused: ``"paused (runner)"``."""
    if job.state == S.PAUSED and job.pause_mode:
        return f"{job.state} ({job.pause_mode})"
    return job.state


def progress_text(job: JobRecord) -> str:
    """One line: state, epoch, step, loss, ETA, RAM, VRAM."""
    parts = [f"[{job.id}] {state_text(job)}"]
    parts += formats.progress_parts(job.epoch, job.epochs, job.step, job.steps)
    loss = job.metrics.get("loss")
    if loss is not None:
        parts.append(f"loss {formats.loss(loss)}")
    if job.eta_seconds is not None:
        parts.append(f"ETA {formats.duration(job.eta_seconds, compact=True)}")
    parts.append(f"RAM {formats.format_bytes(job.rss_bytes)}")
    parts.append(f"VRAM {formats.format_bytes(job.vram_bytes)}")
    return " · ".join(parts)


def progress_cell(job: JobRecord) -> str:
    """The table's progress: ``"epoch 3/10, step 50/100"``, an ended job's exit status."""
    parts = formats.progress_parts(job.epoch, job.epochs, job.step, job.steps)
    if not job.is_live and job.exit_code is not None:
        parts.append(f"exit {job.exit_code}")
    return ", ".join(parts) or "-"


def format_jobs(jobs: Iterable[JobRecord]) -> str:
    """The jobs as a table: id, name, state, progress, RAM, VRAM, started."""
    head = ("ID", "NAME", "STATE", "PROGRESS", "RAM", "VRAM", "STARTED")
    rows = [head]
    for j in jobs:
        rows.append((j.id, j.name[:NAME_WIDTH], state_text(j), progress_cell(j),
                     formats.format_bytes(j.rss_bytes), formats.format_bytes(j.vram_bytes),
                     formats.started(j.started)))
    if len(rows) == 1:
        return "no jobs"
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def describe(job: JobRecord) -> str:
    """One line: the job and its state now."""
    extra = ""
    if job.state == S.PAUSED and job.pause_mode:
        extra = f" ({job.pause_mode})"
    elif job.state in _WITH_REASON and job.end_reason:
        extra = f" ({job.end_reason})"
    return f"job {job.id} ({job.name}): {job.state}{extra}"


def cmd_jobs(args: argparse.Namespace, paths: Paths) -> int:
    # An engine is started when state exists: it adopts jobs left running and knows the parked.
    client = connect(paths, start=paths.db_file.exists(), demo=demo(args),
                     config_file=config_file(args))
    try:
        jobs = client.jobs(all=bool(args.all))
    finally:
        client.close()
    if args.json:
        print(json.dumps(jobs, indent=None))  # as the engine sent it: the contract of DESIGN.md
    elif not jobs and not args.all:
        # Where a job that just ended went, a stopped one that 'headroom resume' continues too.
        print("no running, paused or parked jobs ('headroom jobs --all' lists the ended ones, "
              "stopped included)")
    else:
        print(format_jobs(records(jobs)))
    return EXIT_OK


def cmd_action(args: argparse.Namespace, paths: Paths) -> int:
    """``pause``, ``resume``, ``park`` or ``stop`` (``args.command``) on ``args.job``."""
    # Resuming a parked job needs an engine to launch it; the others act on a running one.
    start = args.command == "resume" and paths.db_file.exists()
    client = connect(paths, start=start, demo=demo(args), config_file=config_file(args))
    try:
        job = client.job_action(args.job, args.command)
    finally:
        client.close()
    print(describe(JobRecord.from_json(job)))
    return EXIT_OK
