"""The engine poller and the request runner against real engines: snapshots off the GUI
thread, "unreachable" while the engine is gone, reconnection when it is back, an engine started
when none runs, and requests answered on the GUI thread."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Dict, List

import pytest

from trayapp.config import Paths
from trayapp.engine.client import EngineClient, EngineUnavailable
from trayapp.engine.status_record import Status
from trayapp.ui.worker import CallRunner, EngineWorker


@pytest.fixture
def worker_on(qtbot, paths: Paths):  # type: ignore[no-untyped-def]
    made: List[EngineWorker] = []

    def make(**kw: Any) -> EngineWorker:
        kw.setdefault("start_engine", False)
        w = EngineWorker(paths, retry_seconds=0.1, max_retry_seconds=0.5, **kw)
        made.append(w)
        return w

    yield make
    for w in made:
        assert w.stop(10000)


def test_snapshots_arrive_whole_and_off_the_gui_thread(qtbot, demo_engine, worker_on) -> None:
    w = worker_on()
    threads: List[Any] = []
    snapshots: List[Status] = []
    w.snapshot.connect(lambda s: (snapshots.append(s), threads.append(threading.get_ident())))
    with qtbot.waitSignal(w.config, timeout=15000) as config:
        w.start()
    assert config.args[0].value("guard.warn_available") == "15%"
    qtbot.waitUntil(lambda: len(snapshots) >= 3, timeout=15000)
    # Delivered on the GUI thread, each a whole status read into its record.
    assert set(threads) == {threading.get_ident()}
    for s in snapshots:
        assert isinstance(s, Status) and s.memory is not None and s.gpus and s.engine.running
    assert snapshots[-1].engine.pid == demo_engine.proc.pid
    assert snapshots[-1].time > snapshots[0].time
    assert not w.started_engine


def test_unreachable_then_back(qtbot, start_engine, worker_on) -> None:
    first = start_engine(demo=True)
    w = worker_on()
    snapshots: List[Status] = []
    w.snapshot.connect(snapshots.append)
    w.start()
    qtbot.waitUntil(lambda: len(snapshots) >= 1, timeout=15000)
    with qtbot.waitSignal(w.unreachable, timeout=15000) as gone:
        first.kill()
    assert gone.args[0]
    second = start_engine(demo=True)
    qtbot.waitUntil(lambda: snapshots[-1].engine.pid == second.proc.pid, timeout=20000)


def test_an_engine_is_started_when_none_runs(qtbot, paths: Paths, worker_on) -> None:
    w = worker_on(start_engine=True, demo=True)
    messages: List[str] = []
    w.unreachable.connect(messages.append)
    snapshots: List[Status] = []
    w.snapshot.connect(snapshots.append)
    w.start()
    try:
        qtbot.waitUntil(lambda: len(snapshots) >= 1, timeout=30000)
        assert w.started_engine
        assert messages[:1] == ["starting the engine"]
        assert snapshots[-1].engine.demo is True
    finally:
        w.halt()
        assert w.stop(10000)
        pid = snapshots[-1].engine.pid if snapshots else None
        try:
            with EngineClient(paths, timeout=5) as c:
                c.shutdown(force=True)
        except EngineUnavailable:
            pass
        if pid:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.05)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of ours counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_calls_run_off_the_gui_thread_and_answer_on_it(qtbot, demo_engine, paths) -> None:
    runner = CallRunner(lambda: EngineClient(paths, timeout=10))
    seen: Dict[str, Any] = {}
    try:
        def call(c: EngineClient) -> Any:
            seen["call_thread"] = threading.get_ident()
            return c.guard_mode("dry-run")

        def done(result: Any) -> None:
            seen["done_thread"] = threading.get_ident()
            seen["result"] = result

        runner.submit(call, on_done=done)
        runner.submit(lambda c: c.job_action("no-such-job", "pause"),
                      on_error=lambda msg: seen.__setitem__("error", msg))
        qtbot.waitUntil(lambda: "result" in seen and "error" in seen, timeout=15000)
        assert seen["call_thread"] != threading.get_ident()
        assert seen["done_thread"] == threading.get_ident()
        assert seen["result"].value("guard.mode") == "dry-run"
        assert "no-such-job" in seen["error"] or "job" in seen["error"]
        with qtbot.waitSignal(runner.failed, timeout=15000) as failed:
            runner.submit(lambda c: c.job_action("no-such-job", "stop"))
        assert failed.args[0]
        assert runner.pending() == 0
    finally:
        runner.close()
