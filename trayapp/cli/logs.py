"""``headroom logs JOB [-f] [--tail N]`` (a job's output, as its log keeps it), ``headroom
attach JOB`` (follow a running job again as ``headroom run`` does, its progress and the guard's
events too) and ``headroom resume JOB --follow`` (resume it, then attach). Ctrl-C leaves the job
running.

A job keeps one log for its whole life, its relaunches from a checkpoint included (a resume, the
guard's relaunch at a smaller batch): both follow it across them, under its id.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Optional, TextIO

from trayapp.cli.base import (
    EXIT_INTERRUPTED,
    EXIT_NO_ENGINE,
    EXIT_OK,
    config_file,
    demo,
    say,
    show,
)
from trayapp.cli.follow import Follower
from trayapp.cli.jobs import cmd_action, describe
from trayapp.cli.screen import Screen
from trayapp.config import Paths
from trayapp.engine.client import EngineBusy, EngineClient, EngineUnavailable, connect
from trayapp.jobs.record import JobRecord

POLL_SECONDS = 0.2
ATTACH_TAIL_LINES = 20  # of the output so far, shown before ``attach`` follows on
TAIL_STEP_BYTES = 64 * 1024  # a tail is looked for this much further back each time


def tail_offset(client: EngineClient, job: str, lines: int) -> int:
    """The byte of ``job``'s log where its last ``lines`` lines start (0: the whole log)."""
    size = client.job_log(job, max_bytes=1).size
    if lines <= 0:
        return size
    back = TAIL_STEP_BYTES
    while True:
        start = max(0, size - back)
        text, offset = "", start
        while offset < size:
            page = client.job_log(job, offset=offset)
            data = page.data
            if not data:
                break
            text += data
            offset = page.offset or size
        # A line is complete when a newline ends it; the last one may still be open.
        body = text[:-1] if text.endswith("\n") else text
        newlines = [i for i, ch in enumerate(body) if ch == "\n"]
        if len(newlines) >= lines:
            cut = newlines[-lines] + 1
            # Counted from the end: a character cut at the start of the read is not there.
            return offset - len(text[cut:].encode("utf-8"))
        if start == 0:
            return 0
        back *= 2


def follow_log(client: EngineClient, job_id: str, offset: int, screen: Screen, follow: bool) -> int:
    """Copy ``job_id``'s log from ``offset`` to ``screen``; with ``follow``, until the job has
    ended (a parked job the guard resumes by itself is waited for). Returns the job's record
    at the end, as JSON."""
    while True:
        page = client.job_log(job_id, offset=offset)
        data = page.data
        offset = page.offset or offset
        if data:
            screen.output(data)
        if offset < page.size and data:
            continue  # more of it already there
        if not follow:
            return offset
        job = client.job_get(job_id)
        if not job.is_live and not _resumes_by_itself(job):
            page = client.job_log(job_id, offset=offset)  # what it wrote last
            if page.data:
                screen.output(page.data)
                offset = page.offset or offset
                continue
            return offset
        time.sleep(POLL_SECONDS)


def _resumes_by_itself(job: JobRecord) -> bool:
    return job.is_parked and job.parked_by == "guard" and job.auto_resume


def cmd_logs(args: argparse.Namespace, paths: Paths, out: Optional[TextIO] = None) -> int:
    out = out or sys.stdout
    # The engine knows the ended jobs too (from the store): one is started when state exists.
    client = connect(
        paths, start=paths.db_file.exists(), demo=demo(args), config_file=config_file(args)
    )
    screen = Screen(out, sys.stderr)
    try:
        job = client.job_get(args.job)
        if job.is_kernel:
            say(
                f"job {job.id} ({job.name}) is a Jupyter kernel: its output is in its notebook, "
                "and Headroom keeps no log of it ('headroom jobs' shows its fit's progress)"
            )
            return EXIT_OK
        offset = 0 if args.tail is None else tail_offset(client, job.id, args.tail)
        if args.follow and job.is_live:
            say(
                f"following the log of job {job.id} ({job.name}) until it ends; Ctrl-C leaves "
                "it running"
            )
        try:
            follow_log(client, job.id, offset, screen, follow=bool(args.follow))
        except KeyboardInterrupt:
            screen.end_line()
            say(f"left the log of job {job.id}; the job goes on running")
            return EXIT_INTERRUPTED
        except (EngineUnavailable, EngineBusy):
            screen.end_line()
            say(f"the engine went away; job {job.id} goes on running (see 'headroom jobs')")
            return EXIT_NO_ENGINE
        screen.end_line()
    finally:
        client.close()
    return EXIT_OK


def attach(
    client: Any,
    paths: Paths,
    job: JobRecord,
    args: argparse.Namespace,
    offset: Optional[int] = None,
) -> int:
    """Follow ``job`` as ``headroom run`` does, from byte ``offset`` of its log (default: its
    last lines); Ctrl-C leaves it running. Returns the exit status ``headroom run`` would
    have."""
    if offset is None:
        offset = tail_offset(client, job.id, ATTACH_TAIL_LINES)
    follower = Follower(client, paths, job, detach=True, offset=offset)
    follower.engine_options = {"demo": demo(args), "config_file": config_file(args)}
    try:
        return follower.run()
    finally:
        follower.client.close()


def cmd_attach(args: argparse.Namespace, paths: Paths) -> int:
    client = connect(
        paths, start=paths.db_file.exists(), demo=demo(args), config_file=config_file(args)
    )
    try:
        job = client.job_get(args.job)
    except BaseException:
        client.close()
        raise
    return attach(client, paths, job, args)


def cmd_resume(args: argparse.Namespace, paths: Paths) -> int:
    """``headroom resume JOB [--follow]``: with ``--follow``, the job is followed as by
    ``attach``, from its output after the resume on."""
    if not args.follow:
        return cmd_action(args, paths)
    client = connect(
        paths, start=paths.db_file.exists(), demo=demo(args), config_file=config_file(args)
    )
    try:
        # A relaunch's output starts at the end of the log as it is now.
        offset = tail_offset(client, args.job, 0)
        job = client.job_action(args.job, "resume")
    except BaseException:
        client.close()
        raise
    show(describe(job))
    return attach(client, paths, job, args, offset=offset)
