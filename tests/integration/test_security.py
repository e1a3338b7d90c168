"""Security of the channels: private folder and key, refused strangers, no network listener."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import psutil
import pytest

from tests.conftest import REPO, EngineProcess


def test_key_file_is_0600_and_runtime_folder_0700(engine: EngineProcess) -> None:
    p = engine.paths
    assert stat.S_IMODE(os.stat(p.runtime_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(p.key_file).st_mode) == 0o600
    assert os.stat(p.key_file).st_uid == os.getuid()
    assert len(p.key_file.read_bytes()) >= 32


def test_wrong_key_is_refused(engine: EngineProcess) -> None:
    with pytest.raises(AuthenticationError):
        Client(engine.paths.control_address, family="AF_UNIX", authkey=os.urandom(32))


def test_a_new_key_every_start(start_engine) -> None:  # type: ignore[no-untyped-def]
    first = start_engine()
    key1 = first.paths.key_file.read_bytes()
    first.stop()
    second = start_engine()
    assert second.paths.key_file.read_bytes() != key1


def _python_for_nobody() -> str:
    """A Python that the user ``nobody`` may run (root's own may sit in a private folder)."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        r = subprocess.run(["runuser", "-u", "nobody", "--", candidate, "-c", "pass"],
                           capture_output=True, timeout=30, cwd="/")
        if r.returncode == 0:
            return candidate
    pytest.skip("no Python that the user nobody can run")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None,
                    reason="needs root and runuser to act as another user")
def test_another_user_is_refused(engine: EngineProcess) -> None:
    # The other user gets the key's bytes too (as if leaked): the folder alone must stop them.
    probe = (
        "import sys\n"
        "from multiprocessing.connection import Client\n"
        "try:\n"
        "    Client(sys.argv[1], family='AF_UNIX', authkey=bytes.fromhex(sys.argv[2]))\n"
        "    print('CONNECTED')\n"
        "except Exception as e:\n"
        "    print('REFUSED', type(e).__name__)\n"
    )
    r = subprocess.run(["runuser", "-u", "nobody", "--", _python_for_nobody(), "-c", probe,
                        engine.paths.control_address, engine.paths.key_file.read_bytes().hex()],
                       capture_output=True, text=True, timeout=30, cwd="/")
    assert "REFUSED" in r.stdout, r.stdout + r.stderr
    assert "CONNECTED" not in r.stdout
    r = subprocess.run(["runuser", "-u", "nobody", "--", "cat", str(engine.paths.key_file)],
                       capture_output=True, timeout=30, cwd="/")
    assert r.returncode != 0 and not r.stdout


def test_nothing_listens_on_a_network_address(engine: EngineProcess) -> None:
    proc = psutil.Process(engine.proc.pid)
    assert proc.net_connections(kind="inet") == []
    unix = [c for c in proc.net_connections(kind="unix") if c.laddr]
    assert any(c.laddr == engine.paths.control_address for c in unix)


def test_no_pickle_anywhere_in_the_channels() -> None:
    # Connection.recv()/send() pickle; only recv_bytes/send_bytes with JSON are allowed.
    offenders = []
    for path in (REPO / "trayapp").rglob("*.py"):
        text = path.read_text()
        for bad in (".recv()", ".recv(timeout", "import pickle", "from pickle", "cPickle"):
            if bad in text:
                offenders.append(f"{path.relative_to(REPO)}: {bad}")
    assert offenders == []
