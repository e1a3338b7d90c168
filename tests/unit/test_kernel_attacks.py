"""A kernel's registration against an engine that answers garbage to ``kernel_adopt`` (a real
socket speaking the engine's authenticated protocol): the kernel's background registration
survives every answer and registers once a real one comes."""

from __future__ import annotations

import json
import os
import threading
import types
from multiprocessing.connection import Listener
from pathlib import Path
from typing import Any, Iterator, List

import pytest

from trayapp.runner import engine_home, kernel
from trayapp.runner.kernel import Adopter, parse_adopted

GOOD = {"job": "ab12", "address": "/nonexistent/job-ab12.sock", "key": "00ff"}
GARBAGE: List[bytes] = [
    b"\xff\xfe not json",
    b"[1, 2]",
    json.dumps({"id": 1, "ok": True, "result": {**GOOD, "key": "abc"}}).encode(),  # odd hex
    json.dumps({"id": 1, "ok": True, "result": {**GOOD, "address": "\x00"}}).encode(),
    json.dumps({"id": 1, "ok": True, "result": {**GOOD, "job": "ab\n12"}}).encode(),
]


class FakeEngine:
    """Listens where the runner looks for the engine; answers each request with the next of
    ``answers`` (the last one for ever after)."""

    def __init__(self, environ: dict, answers: List[bytes]):
        address, keyfile = engine_home.control(environ)
        os.makedirs(os.path.dirname(address), mode=0o700, exist_ok=True)
        key = os.urandom(32)
        fd = os.open(keyfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, key)
        os.close(fd)
        self.listener = Listener(address, "AF_UNIX", authkey=key)
        self.answers = answers
        self.asked = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn = self.listener.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.recv_bytes()
                    conn.send_bytes(self.answers[min(self.asked, len(self.answers) - 1)])
                except (OSError, EOFError):
                    pass
                self.asked += 1


@pytest.fixture()
def environ(tmp_path: Path) -> Iterator[dict]:
    yield {"HEADROOM_HOME": str(tmp_path / "h")}


def test_an_odd_length_key_is_not_an_answer() -> None:
    assert parse_adopted({**GOOD, "key": "abc"}) is None  # bytes.fromhex raised ValueError


def test_registration_survives_every_garbage_answer_then_registers(
        environ: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel, "RETRY_SECONDS", 0.02)
    monkeypatch.setattr(kernel, "RETRY_MAX_SECONDS", 0.05)
    good = json.dumps({"id": 1, "ok": True, "result": GOOD}).encode()
    engine = FakeEngine(environ, [*GARBAGE, good])
    closed: List[Any] = []
    old = types.SimpleNamespace(connected=False, close=lambda timeout=0: closed.append(1))
    session = types.SimpleNamespace(channel=old, job_id=None, on_command=lambda m: None,
                                    hello=lambda: {})
    adopter = Adopter(session, {"pid": os.getpid()}, environ)
    adopter.kernel_up.set()
    adopter.start()
    try:
        for _ in range(200):
            if adopter.adopted is not None:
                break
            threading.Event().wait(0.05)
        assert adopter.adopted == ("ab12", GOOD["address"], b"\x00\xff"), engine.asked
        assert engine.asked > len(GARBAGE) and adopter.refused == len(GARBAGE)
        assert session.job_id == "ab12" and closed == [1]
    finally:
        adopter.stop()
        session.channel.close(timeout=0)
        engine.listener.close()


# -- where a kernel spec is written -------------------------------------------------------------


def spec_data() -> dict:
    return {"argv": ["python"], "display_name": "x", "language": "python",
            "metadata": {"headroom": {"v": 1}}}


def test_a_spec_is_not_written_where_another_user_could_swap_it(tmp_path: Path) -> None:
    from trayapp.jobs import kernelspec as ks

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # a --prefix everyone can write (no sticky bit)
    with pytest.raises(ks.KernelSpecError, match="every user"):
        ks.install(spec_data(), "k", ks.prefix_kernels_dir(str(shared)), private=False)
    assert not (shared / "share").exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "k").symlink_to(elsewhere)  # a spec folder that points elsewhere
    with pytest.raises(ks.KernelSpecError, match="symbolic link"):
        ks.install(spec_data(), "k", kernels, private=True)
    assert list(elsewhere.iterdir()) == []
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # as /tmp: others cannot replace what is this user's
    done = ks.install(spec_data(), "k", sticky / "kernels", private=True)
    assert done.path.is_file()


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="chown needs root")
def test_a_spec_is_not_written_into_a_folder_of_another_user(tmp_path: Path) -> None:
    from trayapp.jobs import kernelspec as ks

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    with pytest.raises(ks.KernelSpecError, match="another user"):
        ks.install(spec_data(), "k", theirs / "kernels", private=True)
