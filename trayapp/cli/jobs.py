"""``headroom jobs`` and the job actions (``pause``, ``resume``, ``park``, ``stop``), and how a
job reads in the terminal: its progress line (``run``, ``status``), its row in the table, its
state after an action."""

from __future__ import annotations

import argparse
import json
from typing import Iterable, List, Optional, Tuple

from trayapp import formats, vocab
from trayapp.cli.base import EXIT_OK, config_file, demo, show
from trayapp.config import Paths
from trayapp.engine.client import connect
from trayapp.jobs.cgroups import tag_of
from trayapp.jobs.job import COOPERATIVE, SUSPENDED, who
from trayapp.jobs.record import JobRecord
from trayapp.runner.protocol import PARK_EXIT_CODE, STOP_EXIT_CODE
from trayapp.text import one_line
from trayapp.vocab import JobState as S

NAME_WIDTH = 24  # a longer name is cut in the table
# Ended states whose reason is shown after the state in an action's answer.
_WITH_REASON = vocab.ENDED - {S.FINISHED.value} | vocab.PARKED


_PAUSE_MODES = {COOPERATIVE: "at a batch end", SUSPENDED: "(its processes suspended)"}


def _by(job: JobRecord) -> Tuple[Optional[str], Optional[str]]:
    """Who put the job in its state, and why (None, None when no one is told)."""
    if job.state in (S.PAUSED, S.PAUSING):
        return job.paused_by, job.pause_reason
    if job.state in (S.PARKED, S.PARKING):
        return job.parked_by, job.park_reason
    if job.state in (S.STOPPED, S.STOPPING):
        return job.stopped_by, job.stop_reason
    return None, None


def state_text(job: JobRecord, reason: bool = False) -> str:
    """The state in words: ``"paused at a batch end by you"``, ``"parked by the guard"``;
    with ``reason``, why too: ``"parked by the guard: memory low"``."""
    text = str(job.state)
    if job.state == S.PAUSED and job.pause_mode:
        text += " " + _PAUSE_MODES.get(job.pause_mode, f"({job.pause_mode})")
    by, why = _by(job)
    if by:
        text += f" by {who(by)}"
        if reason and why:
            text += f": {why}"
    elif reason and job.state in _WITH_REASON and job.end_reason and job.end_reason != job.state:
        # "parked by guard" of a record without parked_by is not said twice.
        end = job.end_reason
        text = end if end.startswith(f"{job.state} ") else f"{text} ({end})"
    if job.is_live and not job.answering:
        text += ", not answering"  # its channel was cut: handled by signals
    return text


def progress_text(job: JobRecord) -> str:
    """One line: state, epoch, step, loss, ETA, RAM, VRAM."""
    parts = [f"[{job.id}] {state_text(job)}"]
    idle = job.kernel_idle
    position = formats.progress_parts(job.epoch, job.epochs, job.step, job.steps)
    if idle:  # what follows is the last fit's
        position = ["idle, last fit " + " · ".join(position)] if position else ["idle"]
    parts += position
    shrunk = formats.batch(job.batch, job.micro_batch, job.accumulation)
    if shrunk:  # "" for a batch as the user gave it (accumulation 1)
        parts.append(shrunk)
    loss = job.metrics.get("loss")
    if loss is not None:
        parts.append(f"loss {formats.loss(loss)}")
    if job.eta_seconds is not None and not idle:
        parts.append(f"ETA {formats.duration(job.eta_seconds, compact=True)}")
    parts.append(f"RAM {formats.format_bytes(job.rss_bytes)}")
    parts.append(f"VRAM {formats.format_bytes(job.vram_bytes)}")
    return " · ".join(parts)


def progress_cell(job: JobRecord) -> str:
    """The table's progress: ``"epoch 3/10, step 50/100"``, an ended job's exit status; a
    kernel between fits: ``"idle (last fit: epoch 3/10, step 50/100)"``."""
    parts = formats.progress_parts(job.epoch, job.epochs, job.step, job.steps)
    shrunk = formats.batch(job.batch, job.micro_batch, job.accumulation)
    if shrunk:  # "" for a batch as the user gave it (accumulation 1)
        parts.append(shrunk)
    status = exit_text(job)
    if status:
        parts.append(status)
    if job.kernel_idle:
        return f"idle (last fit: {', '.join(parts)})" if parts else "idle"
    return ", ".join(parts) or "-"


def exit_text(job: JobRecord) -> str:
    """An ended job's exit status when it says more than its state: ``"exit 1"``; nothing for
    a job parked (75) or stopped (76) on purpose, or one that finished."""
    if job.is_live or job.exit_code is None or job.exit_code == 0:
        return ""
    if job.state in (S.PARKED, S.STOPPED) and job.exit_code in (PARK_EXIT_CODE, STOP_EXIT_CODE):
        return ""
    return f"exit {job.exit_code}"


def format_jobs(jobs: Iterable[JobRecord]) -> str:
    """The jobs as a table: id, name, state, progress, RAM, VRAM, started, protection (the
    kernel brake's tag: brake-v1, or guard for the guard alone)."""
    head = ("ID", "NAME", "STATE", "PROGRESS", "RAM", "VRAM", "STARTED", "PROTECTION")
    rows: List[Tuple[str, ...]] = [head]
    for j in jobs:
        # Escaped before the columns are measured, so that they line up.
        rows.append(
            tuple(
                one_line(cell)
                for cell in (
                    j.id,
                    one_line(j.name)[:NAME_WIDTH],
                    state_text(j),
                    progress_cell(j),
                    formats.format_bytes(j.rss_bytes),
                    formats.format_bytes(j.vram_bytes),
                    formats.started(j.started),
                    tag_of(j.protection),
                )
            )
        )
    if len(rows) == 1:
        return "no jobs"
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def describe(job: JobRecord) -> str:
    """One line: the job and its state now, with why."""
    return f"job {job.id} ({job.name}): {state_text(job, reason=True)}"


def describe_interrupt(job: JobRecord) -> str:
    """A kernel's park is "interrupt the fit": what happened, and how to go on."""
    head = f"kernel {job.id} ({job.name})"
    if job.state == S.PARKING:
        return f"{head}: its fit is interrupted at the next batch end (the kernel stays)"
    if job.state in vocab.ENDED:
        return describe(job)
    point = job.checkpoint.path if job.checkpoint is not None else None
    saved = f"; its checkpoint is in {point}" if point else " (no checkpoint folder: nothing saved)"
    return (
        f"{head}: its fit was interrupted{saved}. The kernel and its variables are kept; run "
        "the same fit() again to go on"
    )


def describe_kernel_stop(job: JobRecord) -> str:
    """A kernel's stop shuts it down: what happened to it and to its variables."""
    head = f"kernel {job.id} ({job.name})"
    if job.state == S.STOPPING:
        return (
            f"{head}: its fit stops at the next batch end (after a checkpoint, with a "
            "checkpoint folder), then the kernel shuts down; its variables are lost"
        )
    if job.state in vocab.ENDED:
        return (
            f"{head}: {state_text(job, reason=True)}; the kernel is shut down and its "
            "variables are lost (Jupyter may start a fresh, empty kernel)"
        )
    return describe(job)


def cmd_jobs(args: argparse.Namespace, paths: Paths) -> int:
    # An engine is started when state exists: it adopts jobs left running and knows the parked.
    client = connect(
        paths, start=paths.db_file.exists(), demo=demo(args), config_file=config_file(args)
    )
    try:
        jobs = client.jobs(all=bool(args.all))
    finally:
        client.close()
    if args.json:
        print(json.dumps([j.to_json() for j in jobs], indent=None))  # DESIGN.md's records
    elif not jobs and not args.all:
        # Where a job that just ended went, a stopped one that 'headroom resume' continues too.
        print(
            "no running, paused or parked jobs ('headroom jobs --all' lists the ended ones, "
            "stopped included)"
        )
    else:
        show(format_jobs(jobs))
    return EXIT_OK


def cmd_action(args: argparse.Namespace, paths: Paths) -> int:
    """``pause``, ``resume``, ``park`` or ``stop`` (``args.command``) on ``args.job``."""
    # Resuming a parked job needs an engine to launch it; the others act on a running one.
    start = args.command == "resume" and paths.db_file.exists()
    client = connect(paths, start=start, demo=demo(args), config_file=config_file(args))
    try:
        record = client.job_action(args.job, args.command)
    finally:
        client.close()
    if record.is_kernel and args.command == "park":
        show(describe_interrupt(record))
    elif record.is_kernel and args.command == "stop":
        show(describe_kernel_stop(record))
    else:
        show(describe(record))
    return EXIT_OK
