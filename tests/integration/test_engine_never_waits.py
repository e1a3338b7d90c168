"""No job can stall the engine: a job whose script takes its runner's channel and never reads
what the engine sends, while it floods hellos (each of which, in a pause under way, asks the
engine to ask again), costs the engine nothing: ``headroom status`` answers within 2 s
throughout, a hog over its budget is still paused by the guard, a new job starts, and the
job that does not read is cut off, shown as not answering and suspended by signals.

Then the same with hypothesis: any sequence of job messages, sent on connections that are
never read, leaves the engine answering and the guard pausing a hog at its budget.

Real engine, real jobs, real sockets; the hogs are bounded and ended in a ``finally``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any, Callable, Dict, List

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import REPO, EngineProcess, wait_for
from tests.integration.test_boundary_properties import (
    EXAMPLES,
    hog_is_paused_by_the_guard,
    job_messages,
    no_tracebacks,
    to_text,
)
from trayapp.engine.client import EngineClient
from trayapp.runner import protocol as rp

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and sockets")

JOBS = REPO / "tests" / "scripts" / "jobs"
NEVER_READS = str(JOBS / "never_reads.py")
TICKER = str(JOBS / "ticker.py")
# A pause waits on the runner for a long time: the job's hellos make the engine ask again and
# again, and only the cut-off (not the deadline) can end the wait.
CONFIG = '[guard]\npause_deadline_seconds = 60\n'
STATUS_SECONDS = 2.0


class Answers:
    """``headroom status`` asked again and again from a thread, each answer timed."""

    def __init__(self, engine: EngineProcess):
        self.engine = engine
        self.slowest = 0.0
        self.asked = 0
        self.failures: List[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Answers:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                with EngineClient(self.engine.paths, timeout=STATUS_SECONDS) as c:
                    c.status()
            except Exception as e:  # a status that did not answer in time, or at all
                self.failures.append(f"{type(e).__name__}: {e}")
            self.slowest = max(self.slowest, time.monotonic() - t)
            self.asked += 1
            self._stop.wait(0.2)

    def check(self) -> None:
        assert self.asked >= 3, "status was hardly asked"
        assert not self.failures, self.failures[:3]
        assert self.slowest < STATUS_SECONDS, self.slowest


def pause_in_background(engine: EngineProcess, job_id: str) -> threading.Thread:
    """``headroom pause JOB`` (its answer waits for the pause to land) from a thread."""
    def pause() -> None:
        with contextlib.suppress(Exception):
            with EngineClient(engine.paths, timeout=60) as c:
                c.job_action(job_id, "pause")
    t = threading.Thread(target=pause, daemon=True)
    t.start()
    return t


def kill(engine: EngineProcess, job: Dict[str, Any]) -> None:
    with contextlib.suppress(Exception):
        with EngineClient(engine.paths, timeout=20) as c:
            c.job_action(job.id, "kill", reason="test over")
    with contextlib.suppress(psutil.Error):
        p = psutil.Process(job.pid)
        p.resume()
        p.kill()


def test_a_job_that_never_reads_cannot_stall_the_engine(
        home: Path, tmp_path: Path, start_engine: Callable[..., EngineProcess]) -> None:
    (home / "config.toml").write_text(CONFIG)
    engine = start_engine()
    marker = tmp_path / "flooding"
    with engine.client(timeout=30) as c:
        bad = c.job_start({"script": NEVER_READS, "args": [str(marker)], "name": "never-reads"})
    try:
        wait_for(marker.exists, 60, "the job to flood its channel")
        with engine.client(timeout=30) as c:
            # The engine decides a job's state: "parking" said unasked is the job's claim.
            wait_for(lambda: c.job_get(bad.id).runner_state == "parking", 30,
                     "the claim to be recorded")
            job = c.job_get(bad.id)
            assert job.state == "running" and job.parked_by is None, job
            assert job.hooked and job.answering
        with Answers(engine) as answers:
            pausing = pause_in_background(engine, bad.id)
            # Each hello now asks the engine to ask the runner again: the job's socket fills.
            with engine.client(timeout=30) as c:
                cut = wait_for(lambda: (lambda j: j if not j.answering else None)(
                    c.job_get(bad.id)), 90, "the job to be cut off")
                assert cut.state in ("pausing", "paused"), cut
                paused = wait_for(lambda: (lambda j: j if j.state == "paused" else None)(
                    c.job_get(bad.id)), 30, "the job to be suspended by signals")
                assert paused.pause_mode == "suspended", paused
                events = [e for e in c.events(job=bad.id)]
                assert any("not answering" in e.message for e in events), events
            pausing.join(60)
            # Suspended: stopped by SIGSTOP, or frozen in its cgroup (the kernel brake's).
            assert psutil.Process(bad.pid).status() in (psutil.STATUS_STOPPED,
                                                           psutil.STATUS_DISK_SLEEP)
            # Meanwhile the guard guards the others and a new job starts.
            hog_is_paused_by_the_guard({"engine": engine}, tmp_path)
            with engine.client(timeout=30) as c:
                new = c.job_start({"script": TICKER, "args": ["3", "0.01"], "name": "after"})
                done = wait_for(lambda: (lambda j: j if j.state == "finished" else None)(
                    c.job_get(new.id)), 60, "a new job to run to its end")
                assert done.exit_code == 0
        answers.check()
        with engine.client(timeout=30) as c:
            listed = {j.id: j for j in c.jobs()}
            assert listed[bad.id].answering is False
        no_tracebacks({"engine": engine})
    finally:
        kill(engine, bad)


def never_read(ctx: Dict[str, Any]) -> Connection:
    """A connection on the target job's channel, with its key, that is never read."""
    paths = ctx["engine"].paths
    job_id = ctx["job"].id
    key = (paths.jobs_dir / job_id / "key").read_bytes()
    conn = Client(paths.job_address(job_id), family="AF_UNIX", authkey=key)
    ctx["open"].append(conn)
    del ctx["open"][:-8]  # the oldest are let go (the channel cuts them to make room anyway)
    return conn


HELLO = {"type": "hello", "fit_hook": "installed", "hooked": True, "state": "running"}
STATES = st.sampled_from([{"type": "state", "state": s} for s in
                          ("parking", "pausing", "stopping", "paused", "running", "idle")])
sequences = st.lists(job_messages() | STATES | st.just(HELLO), min_size=1, max_size=40)


def test_job_messages_on_channels_never_read_leave_the_engine_answering(
        home: Path, tmp_path: Path, start_engine: Callable[..., EngineProcess]) -> None:
    (home / "config.toml").write_text(CONFIG)
    engine = start_engine()
    quiet = tmp_path / "quiet"
    with engine.client(timeout=30) as c:
        target = c.job_start({"script": NEVER_READS, "args": [str(quiet), "quiet"],
                              "name": "target"})
    ctx: Dict[str, Any] = {"engine": engine, "job": target, "open": []}
    try:
        wait_for(quiet.exists, 60, "the job's runner to be silenced")
        first = never_read(ctx)
        first.send_bytes(to_text(HELLO).encode())
        with engine.client(timeout=30) as c:
            wait_for(lambda: c.job_get(target.id).hooked, 30, "the job to read as hooked")
        pausing = pause_in_background(engine, target.id)  # a pause that asks and asks

        @settings(EXAMPLES, max_examples=40)
        @given(msgs=sequences)
        def send(msgs: List[Dict[str, Any]]) -> None:
            conn = never_read(ctx)
            for msg in msgs:
                data = to_text(msg).encode("utf-8", "surrogatepass")
                if len(data) > rp.MAX_MESSAGE_BYTES:
                    continue
                try:
                    conn.send_bytes(data)
                except OSError:
                    break  # cut off by the engine: what it does with a peer that never reads
            t = time.monotonic()
            with EngineClient(engine.paths, timeout=STATUS_SECONDS) as c:
                assert c.status().engine.running
            assert time.monotonic() - t < STATUS_SECONDS

        with Answers(engine) as answers:
            send()
            hog_is_paused_by_the_guard(ctx, tmp_path)
        answers.check()
        pausing.join(60)
        no_tracebacks(ctx)
    finally:
        for conn in ctx["open"]:
            with contextlib.suppress(OSError):
                conn.close()
        kill(engine, target)
