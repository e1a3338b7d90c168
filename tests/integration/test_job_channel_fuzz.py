"""Property-based tests of a job's channel against a real engine: whatever a client holding the
job's key sends — random bytes, broken JSON, known message types with wrong field types, huge
messages — the engine keeps the job, keeps its channel open to the real runner, and keeps
answering its control channel. Checked after every example: the engine answers ``status``, its
loop has ticked since (the job bookkeeping and the guard ran with what the job sent), and no
part of a tick has failed."""

from __future__ import annotations

import json
import os
import pickle
import time
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import REPO, EngineProcess, end_processes_of, wait_for
from trayapp import vocab
from trayapp.config import get_paths
from trayapp.engine.client import EngineClient
from trayapp.runner import protocol as rp

FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
TICKER = str(REPO / "tests" / "scripts" / "jobs" / "ticker.py")
TICK_SECONDS = 0.05  # the engine's sample interval here: a tick after each example comes soon
# What the engine's log says when a part of its tick fails (trayapp.engine.parts), or any error.
FAILURES = ("Traceback", "the rest of the tick goes on", "still fails")


@pytest.fixture(scope="module")
def job_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Any]]:
    home = tmp_path_factory.mktemp("jobfuzz-home")
    (home / "config.toml").write_text(f'[engine]\nsample_interval = {TICK_SECONDS}\n'
                                      '[guard]\nmode = "off"\n')
    old = os.environ.get("HEADROOM_HOME")
    os.environ["HEADROOM_HOME"] = str(home)
    try:
        engine = EngineProcess(get_paths()).wait_ready()
        with EngineClient(engine.paths, timeout=30) as c:
            job = c.job_start({"script": TICKER, "args": ["0", "0.2"], "name": "fuzzed"})
            wait_for(lambda: c.job_get(job.id).connected, 30, "the runner's hello")
        yield {"engine": engine, "job": job.id}
        assert engine.proc.poll() is None, "the engine died:\n" + engine.stderr
        engine.stop()
        assert "Traceback" not in engine.stderr, engine.stderr
    finally:
        end_processes_of(home)
        if old is None:
            os.environ.pop("HEADROOM_HOME", None)
        else:
            os.environ["HEADROOM_HOME"] = old


def _job_conn(ctx: Dict[str, Any]):  # type: ignore[no-untyped-def]
    paths = ctx["engine"].paths
    key = (paths.jobs_dir / ctx["job"] / "key").read_bytes()
    return Client(paths.job_address(ctx["job"]), family="AF_UNIX", authkey=key)


def _engine_fine(ctx: Dict[str, Any]) -> None:
    """The engine answers, has ticked since the example sent its bytes (so the job manager and
    the guard have run with them), still has the job live, and logged no failure."""
    engine = ctx["engine"]
    sent = time.time()
    with EngineClient(engine.paths, timeout=10) as c:
        status = wait_for(lambda: (s := c.status()).time > sent + TICK_SECONDS and s, 10,
                          "a tick after the example", every=TICK_SECONDS / 2)
        assert status.engine.running and status.guard.available_bytes
        job = c.job_get(ctx["job"])
        # A state message from the job's own key may say "paused": trusted, but never an end.
        assert job.state in vocab.LIVE, job.state
    log = engine.stderr
    assert not any(f in log for f in FAILURES), log


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8),
                                                                       children, max_size=4),
    max_leaves=10,
)
# Field names the engine reads from the runner's messages, so wrong types reach real code.
fields = st.sampled_from(["epoch", "epochs", "step", "steps", "logs", "tf_memory", "state",
                          "level", "message", "path", "applied", "devices", "hooked", "pid",
                          "python", "tf_version", "exit_code", "reason", "phase", "time"])
messages = st.builds(lambda kind, extra: {**extra, "type": kind},
                     st.sampled_from(sorted(rp.JOB_MESSAGES - {rp.BYE})),
                     st.dictionaries(fields, json_values, max_size=6))


@FUZZ
@given(data=st.binary(max_size=4096))
def test_random_bytes(job_engine: Dict[str, Any], data: bytes) -> None:
    conn = _job_conn(job_engine)
    try:
        conn.send_bytes(data)
    finally:
        conn.close()
    _engine_fine(job_engine)


@FUZZ
@given(msg=messages)
def test_known_messages_with_wrong_types(job_engine: Dict[str, Any], msg: Dict[str, Any]
                                         ) -> None:
    if msg["type"] == rp.HELLO:
        msg = {k: v for k, v in msg.items() if k != "type"} | {"type": rp.NOTE}
    conn = _job_conn(job_engine)
    try:
        conn.send_bytes(json.dumps(msg).encode())
    finally:
        conn.close()
    _engine_fine(job_engine)


def test_huge_and_pickled_messages(job_engine: Dict[str, Any], tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"

    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (open, (str(marker), "w"))

    conn = _job_conn(job_engine)
    try:
        conn.send_bytes(pickle.dumps(Evil()))
        try:
            conn.send_bytes(b"{" + b" " * (2 << 20) + b"}")
        except OSError:
            pass  # dropped: fine
    finally:
        conn.close()
    assert not marker.exists()
    _engine_fine(job_engine)
    # The real runner is still connected and reporting.
    with EngineClient(job_engine["engine"].paths, timeout=10) as c:
        wait_for(lambda: c.job_get(job_engine["job"]).connected, 15,
                 "the real runner still connected")
