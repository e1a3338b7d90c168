"""Another local user cannot get in: the runtime folder, links planted in the state folder, a
state folder or config others can write, and secrets on disk. Attacks by a real second user
(``runuser -u nobody``) on real engines and real commands."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import psutil
import pytest

from tests.conftest import REPO, end_processes_of, run_cli, wait_for
from trayapp.config import Paths, get_paths
from trayapp.engine.client import EngineClient, EngineError, EngineUnavailable

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes and owners"),
]
needs_nobody = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("runuser") is None,
    reason="needs root and runuser to act as another user")

JOBS = REPO / "tests" / "scripts" / "jobs"
SECRET = "sekrit-value"
NOBODY = 65534
# Watch only; an engine a command started stays long enough to be looked at.
CONFIG = '[guard]\nmode = "off"\n\n[engine]\nidle_exit_seconds = 30.0\n'


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


def as_nobody(*argv: str, **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", "nobody", "--", *argv], capture_output=True,
                          text=True, timeout=30, cwd="/", **kw)


def python_for_nobody() -> str:
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if as_nobody(candidate, "-c", "pass").returncode == 0:
            return candidate
    pytest.skip("no Python that the user nobody can run")


def stop_engine_of(paths: Paths) -> None:
    """End the engine a command started on ``paths`` (its pid is in the lock file)."""
    try:
        pid = int(paths.lock_file.read_text().strip() or 0)
    except (OSError, ValueError):
        return
    try:
        proc = psutil.Process(pid)
        if "engine" in proc.cmdline():
            proc.terminate()
            proc.wait(10)
    except psutil.Error:
        pass


# -- the runtime folder, planted by another user ------------------------------------------------

FAKE_ENGINE = r"""
import json, os, sys
from multiprocessing.connection import Listener
folder, log = sys.argv[1], sys.argv[2]
key = os.urandom(32)
listener = Listener(os.path.join(folder, "engine.sock"), family="AF_UNIX", authkey=key)
with open(os.path.join(folder, "engine.key"), "wb") as f:
    f.write(key)
os.chmod(os.path.join(folder, "engine.key"), 0o644)
print("ready", flush=True)
while True:
    conn = listener.accept()
    with open(log, "a") as out:
        out.write("connected\n")
    try:
        while True:
            req = json.loads(conn.recv_bytes())
            with open(log, "a") as out:
                out.write(json.dumps(req) + "\n")
            fake = {"version": "9", "pid": 1, "home": "?", "demo": False}
            if req.get("op") == "status":
                fake = {"time": 0, "memory": {}, "gpus": [], "jobs": [],
                        "guard": {"state": "ok", "reasons": ["ALL IS WELL (fake)"]},
                        "engine": {"running": True, "pid": 1}}
            conn.send_bytes(json.dumps({"id": req.get("id"), "ok": True,
                                        "result": fake}).encode())
    except (EOFError, OSError, ValueError):
        pass
"""


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A temporary folder like /tmp (1777) that the user nobody can reach."""
    d = Path(tempfile.mkdtemp(prefix="hr-shared-", dir="/tmp"))
    os.chmod(d, 0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def deep_home(tmp_path: Path, shared_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Paths]:
    """A state folder whose socket path is too long, so the runtime folder falls back to
    $TMPDIR/headroom-<uid>/<hash> (no $XDG_RUNTIME_DIR)."""
    home = tmp_path / ("d" * 60) / ("e" * 60)
    home.mkdir(parents=True)
    (home / "config.toml").write_text(CONFIG)
    monkeypatch.setenv("HEADROOM_HOME", str(home))
    monkeypatch.setenv("TMPDIR", str(shared_tmp))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)
    paths = get_paths()
    assert paths.runtime_dir.parent == shared_tmp / f"headroom-{os.getuid()}"
    yield paths
    stop_engine_of(paths)
    end_processes_of(home)


@pytest.fixture
def planted(deep_home: Paths, shared_tmp: Path) -> Iterator[Dict[str, Any]]:
    """nobody made headroom-<uid> (0777) first, then the <hash> folder, with a key and a fake
    engine behind a socket of their own."""
    top = deep_home.runtime_dir.parent
    assert as_nobody("mkdir", "-m", "777", str(top)).returncode == 0
    assert as_nobody("mkdir", "-m", "755", str(deep_home.runtime_dir)).returncode == 0
    log = shared_tmp / "fake-engine.log"
    assert as_nobody("touch", str(log)).returncode == 0
    fake = subprocess.Popen(["runuser", "-u", "nobody", "--", python_for_nobody(), "-c",
                             FAKE_ENGINE, str(deep_home.runtime_dir), str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd="/", start_new_session=True)
    try:
        assert fake.stdout is not None and fake.stdout.readline().strip() == "ready"
        yield {"paths": deep_home, "top": top, "log": log}
    finally:
        os.killpg(fake.pid, signal.SIGKILL)  # runuser and the fake engine under it
        fake.communicate(timeout=10)


@needs_nobody
def test_status_refuses_a_runtime_folder_planted_by_another_user(planted: Dict[str, Any]) -> None:
    r = run_cli("status", "--json", timeout=60)
    assert "ALL IS WELL" not in r.stdout
    assert r.returncode == 3, r.stdout + r.stderr
    line = one_line(r.stderr)
    assert str(planted["top"]) in line and "nobody" in line
    assert planted["log"].read_text() == ""  # nothing was sent to the other user's engine


@needs_nobody
def test_run_sends_nothing_to_a_planted_runtime_folder(planted: Dict[str, Any]) -> None:
    r = run_cli("run", "--env", f"API_KEY={SECRET}", str(JOBS / "exit_with.py"), "0",
                env={"SHELL_TOKEN": "shell-secret-value"}, timeout=60)
    sent = planted["log"].read_text()
    assert SECRET not in sent and "shell-secret-value" not in sent
    assert sent == ""  # not even a connection
    assert r.returncode == 3, r.stdout + r.stderr
    line = one_line(r.stderr)
    assert str(planted["top"]) in line and "nobody" in line
    assert not planted["paths"].lock_file.exists()  # and no engine was started there


@needs_nobody
def test_engine_refuses_a_runtime_folder_planted_by_another_user(planted: Dict[str, Any]) -> None:
    r = run_cli("engine", timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_line(r.stderr)
    assert str(planted["top"]) in line and "nobody" in line
    assert not planted["paths"].lock_file.exists()


def test_client_refuses_a_key_another_user_can_read(deep_home: Paths) -> None:
    # Every level is the user's, but the key was left readable by others.
    deep_home.ensure()
    deep_home.key_file.write_bytes(os.urandom(32))
    os.chmod(deep_home.key_file, 0o644)
    with pytest.raises(EngineUnavailable) as e:
        EngineClient(deep_home, timeout=2).ping()
    assert str(deep_home.key_file) in str(e.value) and "0644" in str(e.value)


# -- links planted in the state folder ---------------------------------------------------------


@pytest.fixture
def private_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A state folder with a short path, so that its run/ folder holds the sockets whatever
    the length of pytest's temporary folder (a long one falls back to $TMPDIR)."""
    home = Path(tempfile.mkdtemp(prefix="hr-", dir="/tmp"))
    os.chmod(home, 0o700)
    (home / "config.toml").write_text(CONFIG.replace("30.0", "1.0"))
    monkeypatch.setenv("HEADROOM_HOME", str(home))
    try:
        yield home
    finally:
        end_processes_of(home)
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.parametrize("name", ["engine.lock", "engine.log", "headroom.db", "headroom.db-wal",
                                  "tray.log"])
def test_a_link_planted_at_a_state_file_is_not_written_through(private_home: Path,
                                                               tmp_path: Path, name: str) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's precious file\n")
    os.chmod(victim, 0o644)
    (private_home / name).symlink_to(victim)
    r = run_cli("engine", timeout=60)
    assert victim.read_text() == "the user's precious file\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_line(r.stderr)
    assert str(private_home / name) in line and "symbolic link" in line and "rm " in line
    # The fix the message gives works.
    (private_home / name).unlink()
    r = run_cli("engine", timeout=60)
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "the user's precious file\n"


def test_a_run_link_to_another_folder_gets_no_socket_and_no_chmod(private_home: Path,
                                                                  tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.chmod(elsewhere, 0o755)
    (private_home / "run").symlink_to(elsewhere, target_is_directory=True)
    r = run_cli("engine", timeout=60)
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o755
    assert list(elsewhere.iterdir()) == []
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_line(r.stderr)
    assert str(private_home / "run") in line and "symbolic link" in line


def test_a_jobs_link_is_refused(private_home: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (private_home / "jobs").symlink_to(elsewhere, target_is_directory=True)
    r = run_cli("run", str(JOBS / "exit_with.py"), "0", timeout=60)
    assert r.returncode == 3, r.stdout + r.stderr
    assert str(private_home / "jobs") in one_line(r.stderr)
    assert list(elsewhere.iterdir()) == []


# -- a state folder or a config another user can write -----------------------------------------


def test_a_world_writable_home_is_refused(home: Path) -> None:
    (home / "config.toml").write_text(CONFIG.replace("30.0", "1.0"))
    os.chmod(home, 0o777)
    r = run_cli("engine", timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_line(r.stderr)
    assert str(home) in line and "0777" in line and f"chmod 700 {home}" in line
    assert not (home / "engine.lock").exists() and not (home / "run").exists()
    # A client says so too, and starts nothing.
    r = run_cli("run", str(JOBS / "exit_with.py"), "0", timeout=60)
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"chmod 700 {home}" in one_line(r.stderr)
    assert not (home / "engine.lock").exists()


@needs_nobody
def test_a_config_planted_by_another_user_is_refused(home: Path) -> None:
    config = home / "config.toml"
    config.write_text('[guard]\nmode = "off"\n\n[engine]\nidle_exit_seconds = 1.0\n')
    os.chown(config, NOBODY, NOBODY)
    r = run_cli("engine", timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_line(r.stderr)
    assert str(config) in line and "nobody" in line


def test_a_config_others_can_write_is_refused(home: Path) -> None:
    config = home / "config.toml"
    config.write_text('[guard]\nmode = "off"\n\n[engine]\nidle_exit_seconds = 1.0\n')
    os.chmod(config, 0o666)
    r = run_cli("engine", timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_line(r.stderr)
    assert str(config) in line and "0666" in line and f"chmod 600 {config}" in line


# -- secrets and modes ---------------------------------------------------------------------------


def walk(home: Path) -> List[Path]:
    out = []
    for root, dirs, files in os.walk(home):
        out += [Path(root) / d for d in dirs] + [Path(root) / f for f in files]
    return out


def modes_and_holders(home: Path, secret: bytes) -> Dict[str, Any]:
    """Every path under ``home`` (and ``home``) that is not 0700/0600 or is a link, and every
    file holding ``secret``."""
    wrong, links, holders = [], [], []
    for p in [home, *walk(home)]:
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            links.append(str(p))
            continue
        want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
        if stat.S_IMODE(st.st_mode) != want or st.st_uid != os.getuid():
            wrong.append(f"{p} {stat.S_IMODE(st.st_mode):04o}")
        if stat.S_ISREG(st.st_mode) and secret in p.read_bytes():
            holders.append(p.relative_to(home).as_posix())
    return {"wrong": wrong, "links": links, "holders": holders}


@pytest.fixture
def cli_home(home: Path, paths: Paths) -> Iterator[Path]:
    config = home / "config.toml"
    config.write_text(CONFIG)
    os.chmod(config, 0o644)  # as an editor would leave it
    os.chmod(home, 0o755)  # as an older Headroom made it
    yield home
    stop_engine_of(paths)


def test_after_a_job_with_env_everything_is_private_and_the_value_only_in_one_file(
        cli_home: Path, paths: Paths) -> None:
    r = run_cli("run", "--name", "envjob", "--env", f"API_KEY={SECRET}",
                str(JOBS / "ticker.py"), "3", "0.01",
                env={"SHELL_TOKEN": "shell-secret-value"}, timeout=90)
    assert r.returncode == 0, r.stderr
    assert SECRET not in r.stdout + r.stderr
    (job,) = json.loads(run_cli("jobs", "--json", "--all", timeout=30).stdout)
    assert job["spec"]["env"] == [["API_KEY", None]]
    with EngineClient(paths) as c:
        events = c.events(job=job["id"])
        assert events and SECRET not in json.dumps([e.to_json() for e in events])
    # The engine is still running: its database, WAL and log are all there.
    assert paths.log_file.exists() and Path(f"{paths.db_file}-wal").exists()
    found = modes_and_holders(cli_home, SECRET.encode())
    assert found["wrong"] == [] and found["links"] == []
    assert found["holders"] == [f"jobs/{job['id']}/environ.json"]
    shell = modes_and_holders(cli_home, b"shell-secret-value")
    assert shell["holders"] == [f"jobs/{job['id']}/environ.json"]
    engine_pid = int(paths.lock_file.read_text())
    assert _umask(engine_pid) == 0o077


def job_environ(pid: int) -> Dict[str, str]:
    """The environment of a process just started: /proc shows it once the kernel has set up
    the new program, a moment after the exec that ``Popen`` waits for."""
    return wait_for(lambda: psutil.Process(pid).environ(), 10, f"the environment of {pid}")


def _umask(pid: int) -> Optional[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    return None


def test_a_relaunch_from_the_shown_spec_gets_the_value_back(cli_home: Path,
                                                            paths: Paths) -> None:
    r = run_cli("run", "--name", "first", "--env", f"API_KEY={SECRET}",
                str(JOBS / "exit_with.py"), "0", timeout=90)
    assert r.returncode == 0, r.stderr
    with EngineClient(paths) as c:
        (first,) = c.jobs(all=True)
        spec = dict(first.spec, script=str(JOBS / "ticker.py"), args=["0", "0.2"])
        assert spec["env"] == [["API_KEY", None]]
        # Without saying where the values are, the hidden one is not made up.
        with pytest.raises(EngineError) as e:
            c.job_start(spec)
        assert "API_KEY" in str(e.value)
        job = c.job_start(spec, env_from=first.id)
        try:
            assert job_environ(job.pid)["API_KEY"] == SECRET
            # The job runs with the user's umask (022 here), not the engine's private one.
            assert _umask(job.pid) == 0o022
            assert c.job_get(job.id).spec["env"] == [["API_KEY", None]]
        finally:
            c.job_action(job.id, "kill")
    db = paths.db_file.read_bytes() + Path(f"{paths.db_file}-wal").read_bytes()
    assert SECRET.encode() not in db


@pytest.mark.tensorflow
def test_resume_of_a_parked_job_gets_the_env_value(cli_home: Path, paths: Paths,
                                                   tmp_path: Path) -> None:
    from trayapp.jobs.options import JobSpec

    spec = JobSpec(script=str(JOBS / "keras_train.py"), args=("4", "40", "0.05"),
                   env=(("API_KEY", SECRET),), checkpoint_dir=str(tmp_path / "ckpt"))
    from trayapp.engine.client import connect

    with connect(paths, start=True) as c:
        job = c.job_start(spec.to_json())
        try:
            wait_for(lambda: (c.job_get(job.id).epoch or 0) >= 1, 90,
                     "the first epoch")
            assert c.job_action(job.id, "park").state == "parked"
            resumed = c.job_action(job.id, "resume")
            assert resumed.pid and resumed.pid != job.pid
            assert job_environ(resumed.pid)["API_KEY"] == SECRET
        finally:
            try:
                c.job_action(job.id, "kill")
            except EngineError:
                pass
    found = modes_and_holders(cli_home, SECRET.encode())
    assert found["wrong"] == []
    assert found["holders"] == [f"jobs/{job.id}/environ.json"]


def test_the_state_a_new_home_gets_is_private(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "new" / "home"
    monkeypatch.setenv("HEADROOM_HOME", str(home))
    try:
        r = run_cli("run", str(JOBS / "exit_with.py"), "0", timeout=90)
        assert r.returncode == 0, r.stderr
        found = modes_and_holders(home, b"\0never\0")
        assert found["wrong"] == [] and found["links"] == []
    finally:
        stop_engine_of(get_paths())
        end_processes_of(home)


def db_bytes(paths: Paths) -> bytes:
    out = b""
    for suffix in ("", "-wal", "-shm"):
        p = Path(f"{paths.db_file}{suffix}")
        if p.exists():
            out += p.read_bytes()
    return out


def test_env_values_an_older_engine_saved_leave_the_database(paths: Paths,
                                                            start_engine: Any) -> None:
    from trayapp.engine.store import Store

    # As an older Headroom left it: the value in the saved spec, spec.json and a flat environ.
    paths.ensure()
    spec = {"script": str(JOBS / "ticker.py"), "args": ["1"], "env": [["API_KEY", SECRET]]}
    folder = paths.jobs_dir / "0ld0b123"
    folder.mkdir()
    (folder / "spec.json").write_text(json.dumps(spec))
    (folder / "environ.json").write_text(json.dumps({"PATH": "/usr/bin"}))
    store = Store(paths.db_file)
    now = time.time()
    store.save_row({"id": "0ld0b123", "name": "old", "state": "finished", "started": now - 60,
                    "ended": now - 50, "spec": spec, "exit_code": 0})
    store.close()
    assert SECRET.encode() in db_bytes(paths)
    engine = start_engine()
    with engine.client() as c:
        (old,) = [j for j in c.jobs(all=True) if j.id == "0ld0b123"]
    assert old.spec["env"] == [["API_KEY", None]]
    assert SECRET.encode() not in db_bytes(paths)
    assert SECRET not in (folder / "spec.json").read_text()
    from trayapp.jobs import envfile

    assert envfile.load(folder) == ({"PATH": "/usr/bin"}, {"API_KEY": SECRET})


def test_dry_run_shows_the_value_on_the_users_terminal_and_keeps_it_nowhere(home: Path) -> None:
    # The plan is what the job would get, printed for the user who typed it; nothing is kept.
    r = run_cli("run", "--dry-run", "--env", f"API_KEY={SECRET}", str(JOBS / "ticker.py"),
                timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"API_KEY={SECRET}" in r.stdout
    assert modes_and_holders(home, SECRET.encode())["holders"] == []


def test_a_config_made_writable_by_others_while_the_engine_runs_is_not_applied(
        paths: Paths, start_engine: Any) -> None:
    paths.ensure()
    paths.config_file.write_text('[guard]\nmode = "dry-run"\n')
    engine = start_engine()
    with engine.client() as c:
        assert c.config_get().value("guard.mode") == "dry-run"
    # Someone opened the file to others, and it now says the guard is off.
    paths.config_file.write_text('[guard]\nmode = "off"\n')
    os.chmod(paths.config_file, 0o666)

    def problems() -> List[str]:
        with engine.client() as c:
            return [p for p in c.config_get().problems if "can be written by other users" in p]

    (problem,) = wait_for(problems, 30, "the reload to refuse the file")
    assert str(paths.config_file) in problem and f"chmod 600 {paths.config_file}" in problem
    with engine.client() as c:  # the settings in use stay; "off" is not applied
        assert c.config_get().value("guard.mode") == "dry-run"
        assert c.status().guard.mode == "dry-run"
