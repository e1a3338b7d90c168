"""Starting an engine and waiting for it, as the CLI's ``connect(start=True)`` and the tray's
worker both do it: through ``start_and_wait``, with one named timeout."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from trayapp.config import Paths
from trayapp.engine import client as clientmod
from trayapp.engine.client import EngineClient, EngineUnavailable, connect, start_and_wait

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX state folder checks")


def test_one_timeout_for_every_client() -> None:
    assert connect.__defaults__ is not None
    assert clientmod.ENGINE_START_SECONDS in connect.__defaults__
    assert start_and_wait.__defaults__ is not None
    assert clientmod.ENGINE_START_SECONDS in start_and_wait.__defaults__


def test_the_engine_started_answers(paths: Paths) -> None:
    paths.ensure()
    with EngineClient(paths, timeout=5.0) as client:
        proc = start_and_wait(paths, client)
        assert client.ping()["pid"] == proc.pid
        client.shutdown(force=True)
    proc.wait(20)


def test_an_engine_that_cannot_start_is_said_with_its_log(paths: Paths, home: Path,
                                                          tmp_path: Path) -> None:
    # config.toml links to a file anyone may write: the engine refuses the state and exits 2.
    target = tmp_path / "elsewhere.toml"
    target.write_text("")
    target.chmod(0o666)
    (home / "config.toml").symlink_to(target)
    with EngineClient(paths, timeout=5.0) as client:
        with pytest.raises(EngineUnavailable, match=r"could not start \(exit status 2\); see "):
            start_and_wait(paths, client)


def test_a_wait_that_is_halted_ends_at_once(paths: Paths) -> None:
    halt = threading.Event()
    halt.set()
    with EngineClient(paths, timeout=5.0) as client:
        with pytest.raises(EngineUnavailable, match="^stopped$"):
            start_and_wait(paths, client, halt=halt)


def test_an_engine_that_does_not_answer_in_time(paths: Paths) -> None:
    with EngineClient(paths, timeout=5.0) as client:
        with pytest.raises(EngineUnavailable, match=r"did not start in 0 s; see "):
            start_and_wait(paths, client, timeout=0.0)
