"""The guard for real: an engine process on a temporary HEADROOM_HOME, memory hogs launched
with `headroom run`, thresholds set relative to the memory this machine has free when the
test starts. Every hog has a bound of its own and is ended in a `finally`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import psutil
import pytest

from tests.conftest import REPO, EngineProcess, headroom_cmd, run_cli, suspended
from trayapp.config import Paths
from trayapp.engine.client import EngineClient, EngineUnavailable
from trayapp.jobs.record import JobRecord
from trayapp.probes.memory import make_memory_probe

MiB = 1 << 20
GiB = 1 << 30
SCRIPTS = REPO / "tests" / "scripts" / "guard"
HOG = str(SCRIPTS / "hog.py")
CGROUP_V1 = Path("/sys/fs/cgroup/memory")

pytestmark = pytest.mark.slow


def available() -> int:
    return make_memory_probe().read().available_bytes


def mib(n: float) -> str:
    return f"{int(n // MiB)} MiB"


def write_guard_config(home: Path, **values: Any) -> None:
    lines = ["[guard]"]
    for k, v in values.items():
        lines.append(f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {v}")
    (home / "config.toml").write_text("\n".join(lines).replace("'", '"') + "\n")


def wait_for(what: str, fn: Callable[[], Any], timeout: float, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


class Launch:
    """`headroom run ARGS` in the background (it follows its job until the job ends)."""

    def __init__(self, paths: Paths, args: List[str], env: Optional[Dict[str, str]] = None):
        self.paths = paths
        self.out_path = paths.home / f"run-{time.monotonic_ns()}.out"
        self._out = open(self.out_path, "wb")
        full_env = dict(os.environ, HEADROOM_HOME=str(paths.home), **(env or {}))
        self.proc = subprocess.Popen(headroom_cmd("run", *args), env=full_env, cwd=str(REPO),
                                     stdout=self._out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.job_id: Optional[str] = None

    def job(self, client: EngineClient, timeout: float = 30.0) -> Dict[str, Any]:
        def find() -> Optional[Dict[str, Any]]:
            if self.proc.poll() is not None and self.job_id is None:
                raise AssertionError(f"headroom run exited {self.proc.returncode}:\n"
                                     f"{self.output}")
            jobs = client.jobs(all=True)
            return jobs[0].to_json() if jobs else None

        if self.job_id is None:
            self.job_id = str(wait_for("the job to start", find, timeout)["id"])
        return client.job_get(self.job_id)

    @property
    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def end(self, client: Optional[EngineClient]) -> None:
        """Stop the job (gracefully, then its processes by force) and the command."""
        pids: List[int] = []
        if self.job_id is not None and client is not None:
            with contextlib.suppress(Exception):
                pids = list(client.job_get(self.job_id).pids or [])
                client.job_action(self.job_id, "kill", reason="test over")
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                p.resume()
                p.kill()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._out.close()


def wait_state(client: EngineClient, job_id: str, states: set, timeout: float) -> JobRecord:
    """The job's record once it is in one of ``states``."""
    last: List[JobRecord] = []

    def check() -> Optional[JobRecord]:
        last[:] = [client.job_get(job_id)]
        return last[0] if last[0].state in states else None

    try:
        return wait_for(f"job {job_id} to be {'/'.join(sorted(states))}", check, timeout)
    except AssertionError as e:
        guard = client.status().guard_json
        job = last[0] if last else JobRecord(id=job_id)
        raise AssertionError(f"{e}; the job: state {job.state}, paused by {job.paused_by} "
                             f"({job.pause_reason}), pause mode {job.pause_mode}, RSS "
                             f"{job.rss_bytes}; the guard: "
                             f"{guard.get('state')} {guard.get('reasons')}") from None


def progress_mib(path: Path) -> float:
    """The MiB a hog had allocated at its last report (0 before the first)."""
    try:
        return float(path.read_text().splitlines()[-1].split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def guard_events(client: EngineClient, job_id: Optional[str] = None) -> List[Dict[str, Any]]:
    return [e for e in client.events(limit=500)
            if e.kind.startswith("guard_") and (job_id is None or e.job_id == job_id)]


def pause_event(client: EngineClient, job_id: str) -> Dict[str, Any]:
    """The guard's one pause event of the job: it is recorded just after the job's state
    changes, so a client that saw the state may have to wait a moment for it."""
    def found() -> List[Dict[str, Any]]:
        return [e for e in guard_events(client, job_id) if e.kind == "guard_pause"]

    (pause,) = wait_for(f"the guard's pause event of job {job_id}", found, 10)
    return pause


# -- a job over its own budget ----------------------------------------------------------------


def test_a_job_over_its_ram_budget_is_paused_and_resumed_by_hand(
        start_engine: Callable[..., EngineProcess], paths: Paths, tmp_path: Path) -> None:
    # The guard alone: with the kernel brake a hog resumed by hand goes on only as far as its
    # limit lets it (test_braking.py::test_a_resume_by_hand_gives_the_budget_a_tenth_more).
    (paths.home / "config.toml").write_text("[guard]\nkernel_brake = false\n")
    engine = start_engine()
    progress = tmp_path / "progress"
    # 50 MiB chunks, 100 MiB/s, never more than 600 MiB.
    run = Launch(engine.paths, ["--ram-budget", "300", HOG, "50", "100", "600", str(progress)])
    client = engine.client()
    try:
        job_id = run.job(client).id
        job = wait_state(client, job_id, {"paused"}, 30)
        assert job.paused_by == "guard"
        pause = pause_event(client, job_id)
        assert "over its budget of 300.0 MiB" in pause.message
        assert pause.data["cause"] == "budget_ram"
        assert 300 * MiB <= pause.data["rss_bytes"] <= 400 * MiB  # paused near its budget
        at_pause = progress_mib(progress)
        assert 200 <= at_pause <= 350
        time.sleep(1.0)
        assert progress_mib(progress) == at_pause  # suspended: it allocates nothing more
        st = client.status().guard_json
        assert st["state"] == "pause" and any("over its budget" in r for r in st["reasons"])

        r = run_cli("resume", job_id, env={"HEADROOM_HOME": str(engine.paths.home)})
        assert r.returncode == 0, r.stderr
        wait_for("the hog to allocate again", lambda: progress_mib(progress) > at_pause, 10)
    finally:
        run.end(client)
        client.close()
    assert "over its budget of 300.0 MiB" in run.output  # `headroom run` showed the guard


def _process_stopped(pid: int) -> bool:
    # Stopped by signal; or, with the kernel brake, frozen or held at its limit (state D).
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED,
                                                psutil.STATUS_DISK_SLEEP)
    except psutil.Error:
        return False


def test_the_guard_acts_with_no_client_connected(
        start_engine: Callable[..., EngineProcess], tmp_path: Path) -> None:
    engine = start_engine()
    progress = tmp_path / "progress"
    with engine.client() as c:
        job = c.job_start({"script": HOG, "args": ["50", "100", "600", str(progress)],
                           "ram_budget_mb": 300})
    pid = job.pid
    try:
        # Nobody is connected now: the hog is watched through /proc alone.
        wait_for("the hog to be suspended", lambda: suspended(pid), 30)
        assert progress_mib(progress) <= 350
        with engine.client() as c:
            job = c.job_get(job.id)
            assert job.state == "paused" and job.paused_by == "guard"
    finally:
        with engine.client() as c, contextlib.suppress(Exception):
            c.job_action(job.id, "kill", reason="test over")
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()


def test_the_guard_acts_while_clients_flood_the_channel(
        start_engine: Callable[..., EngineProcess], tmp_path: Path) -> None:
    engine = start_engine()
    progress = tmp_path / "progress"
    stop = threading.Event()
    answered = [0] * 4

    def flood(i: int) -> None:
        with engine.client() as c:
            while not stop.is_set():
                c.status()
                c.jobs()
                answered[i] += 1

    threads = [threading.Thread(target=flood, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    job: Dict[str, Any] = {}
    try:
        with engine.client() as c:
            job = c.job_start({"script": HOG, "args": ["50", "100", "600", str(progress)],
                               "ram_budget_mb": 300})
            job = wait_state(c, job.id, {"paused"}, 30)
            assert job.paused_by == "guard"
            pause = pause_event(c, job.id)
            assert pause.data["rss_bytes"] <= 400 * MiB
        assert progress_mib(progress) <= 350
        assert sum(answered) > 50  # the channel was busy all along
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        if job:
            with engine.client() as c, contextlib.suppress(Exception):
                c.job_action(job.id, "kill", reason="test over")


# -- a machine-wide threshold -----------------------------------------------------------------


@pytest.mark.alone
@pytest.mark.parametrize("predict", [False, True], ids=["reactive", "predictive"])
def test_a_fast_hog_is_paused_at_the_machine_threshold(
        start_engine: Callable[..., EngineProcess], paths: Paths, tmp_path: Path,
        predict: bool) -> None:
    avail = available()
    if avail < 6 * GiB:
        pytest.skip(f"needs 6 GiB available, this machine has {avail / GiB:.1f} GiB")
    pause = avail - int(1.5 * GiB)
    settings: Dict[str, Any] = dict(warn_available=mib(pause + 256 * MiB),
                                    pause_available=mib(pause),
                                    park_available=mib(pause - 512 * MiB),
                                    stop_available=mib(pause - 768 * MiB),
                                    resume_available=mib(pause + 1 * GiB))
    if not predict:
        settings.update(warn_horizon_seconds=0, pause_horizon_seconds=0)
    write_guard_config(paths.home, **settings)
    engine = start_engine()
    progress = tmp_path / "progress"
    # 1 GiB/s in 10 MiB chunks; its own budget (5 GiB) and its size (4 GiB) bound it: 2.5 GiB
    # past the pause threshold, room for other memory on the machine being freed meanwhile.
    run = Launch(engine.paths, ["--ram-budget", "5120", HOG, "10", "1024", "4096",
                                str(progress)])
    client = engine.client()
    try:
        job_id = run.job(client).id
        job = wait_state(client, job_id, {"paused"}, 30)
        assert job.paused_by == "guard"
        ev = pause_event(client, job_id)
        cause = ev.data["cause"]
        if predict:
            assert cause in ("mem_predicted", "mem_pause")
        else:
            assert cause == "mem_pause"
            assert "below the pause threshold" in ev.message
        # It got no further than a sliver past the threshold (the reading taken right
        # before the pause says how far).
        assert ev.data["available_bytes"] >= pause - 150 * MiB
        if not predict:
            assert ev.data["available_bytes"] < pause
        assert progress_mib(progress) < 4096  # the guard, not the hog's own bound, ended it
        st = client.status().guard_json
        assert st["state"] in ("pause", "park")
        assert st["thresholds"]["pause_bytes"] == int(pause // MiB) * MiB
    finally:
        run.end(client)
        client.close()


# -- a memory cgroup --------------------------------------------------------------------------


@contextlib.contextmanager
def engine_in_cgroup(paths: Paths, cgroup: Path) -> Iterator[subprocess.Popen]:
    """An engine that moves itself into ``cgroup`` before it starts (its jobs inherit it)."""
    wrapper = ("import os, sys\n"
               f"open({str(cgroup / 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
               "os.execv(sys.executable, [sys.executable, '-m', 'trayapp', 'engine', "
               "'--stay'])\n")
    err = open(paths.home / "engine-stderr.log", "wb")
    proc = subprocess.Popen([sys.executable, "-c", wrapper], cwd=str(REPO), stderr=err,
                            env=dict(os.environ, HEADROOM_HOME=str(paths.home)),
                            start_new_session=True)
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError((paths.home / "engine-stderr.log").read_text())
            try:
                with EngineClient(paths, timeout=2.0) as c:
                    return c.ping()["pid"] == proc.pid
            except EngineUnavailable:
                return False

        wait_for("the engine", ready, 20)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        err.close()


def _cgroup_v1_usable() -> Optional[str]:
    if os.geteuid() != 0:
        return "needs root to create a memory cgroup"
    if not (CGROUP_V1 / "memory.limit_in_bytes").is_file():
        return "no cgroup v1 memory hierarchy at /sys/fs/cgroup/memory"
    if not os.access(CGROUP_V1, os.W_OK):
        return "/sys/fs/cgroup/memory is read-only here"
    return None


def _remove_cgroup(cgroup: Path) -> None:
    """Move any process left to the root, then remove the folder."""
    if not cgroup.exists():
        return
    for _ in range(50):
        pids = (cgroup / "cgroup.procs").read_text().split()
        for pid in pids:
            with contextlib.suppress(OSError):
                (CGROUP_V1 / "cgroup.procs").write_text(pid)
        try:
            cgroup.rmdir()
            return
        except OSError:
            time.sleep(0.1)
    cgroup.rmdir()


@pytest.mark.skipif(_cgroup_v1_usable() is not None, reason=str(_cgroup_v1_usable()))
def test_a_job_in_a_1_gib_cgroup_is_paused_before_the_oom_killer(paths: Paths,
                                                                  tmp_path: Path) -> None:
    cgroup = CGROUP_V1 / f"headroom-test-{os.getpid()}-{time.monotonic_ns()}"
    cgroup.mkdir()
    progress = tmp_path / "progress"
    try:
        (cgroup / "memory.limit_in_bytes").write_text(str(1 * GiB))
        with engine_in_cgroup(paths, cgroup):
            client = EngineClient(paths)
            # 50 MiB chunks at 300 MiB/s, up to 2 GiB: past the limit if nothing stops it.
            run = Launch(paths, [HOG, "50", "300", "2048", str(progress)])
            try:
                mem = client.status().memory
                assert mem is not None
                assert mem.limit_source == "cgroup" and mem.total_bytes == 1 * GiB
                job_id = run.job(client).id
                job = wait_state(client, job_id, {"paused", "failed", "lost"}, 30)
                assert job.state == "paused" and job.paused_by == "guard", job
                oom = dict(line.split() for line in
                           (cgroup / "memory.oom_control").read_text().splitlines())
                assert oom.get("oom_kill", "0") == "0"
                assert int((cgroup / "memory.max_usage_in_bytes").read_text()) < 1 * GiB
                assert progress_mib(progress) < 1024
                time.sleep(0.5)
                assert client.job_get(job_id).state == "paused"
            finally:
                run.end(client)
                client.close()
    finally:
        _remove_cgroup(cgroup)


# -- a Keras job is parked and continues from its checkpoint ----------------------------------


@pytest.mark.alone
@pytest.mark.tensorflow
def test_a_keras_job_is_parked_and_finishes_after_resume(
        start_engine: Callable[..., EngineProcess], paths: Paths, tmp_path: Path) -> None:
    avail = available()
    if avail < 5 * GiB:
        pytest.skip(f"needs 5 GiB available, this machine has {avail / GiB:.1f} GiB")
    # TensorFlow itself takes well under 1.3 GiB; the 2.5 GiB buffer takes it past park.
    write_guard_config(paths.home, warn_available=mib(avail - 1.3 * GiB),
                       pause_available=mib(avail - 1.4 * GiB),
                       park_available=mib(avail - 1.5 * GiB), stop_available="0 MiB",
                       resume_available=mib(avail - 1.0 * GiB),
                       warn_horizon_seconds=0, pause_horizon_seconds=0)
    engine = start_engine()
    ckpt = tmp_path / "ckpt"
    marker, epoch_log = tmp_path / "buffer-taken", tmp_path / "epochs"
    script = str(SCRIPTS / "keras_hog.py")
    run = Launch(engine.paths, ["--checkpoint-dir", str(ckpt), "--manual-resume", script,
                                "5", str(marker), str(epoch_log), "2560"])
    client = engine.client()
    thresholds = {k: client.config_get().section("guard")[k]
                  for k in ("warn_available", "pause_available", "park_available")}
    try:
        job_id = run.job(client, timeout=60).id
        job = wait_state(client, job_id, {"paused", "parked", "failed", "stopped", "lost",
                                          "finished"}, 120)
        if job.state == "paused":
            # Suspended before memory fell to the park threshold: memory now holds steady, so
            # the ladder rests at pause. The guard parks a paused job that holds what the
            # machine needs: raise the park threshold over what is available now.
            assert job.paused_by == "guard", job
            above = mib(available() + 256 * MiB)
            for name in ("warn_available", "pause_available", "park_available"):
                client.config_set(f"guard.{name}", above)
            job = wait_state(client, job_id, {"parked", "failed", "stopped", "lost",
                                              "finished"}, 60)
            for name, value in thresholds.items():
                client.config_set(f"guard.{name}", value)
        assert job.state == "parked", (job, run.output)
        assert marker.exists()
        assert run.proc.wait(30) == 75  # `headroom run` says the job is parked
        kinds = [e.kind for e in guard_events(client, job_id)]
        assert "guard_park" in kinds and kinds.index("guard_pause") < kinds.index("guard_park")
        first = [line.split() for line in epoch_log.read_text().splitlines()]
        done_before = {int(e) for _, e in first}
        assert {1, 2} <= done_before

        r = run_cli("resume", job_id, env={"HEADROOM_HOME": str(engine.paths.home)})
        assert r.returncode == 0, r.stderr
        job = wait_state(client, job_id, {"finished", "failed", "stopped", "lost", "parked"},
                         120)
        assert job.state == "finished", job
        launches: Dict[str, List[int]] = {}
        for pid, epoch in (line.split() for line in epoch_log.read_text().splitlines()):
            launches.setdefault(pid, []).append(int(epoch))
        assert len(launches) == 2
        _, after = list(launches.values())
        assert min(after) >= 3  # epochs 1 and 2 were not trained again
        assert after[-1] == 5
    finally:
        run.end(client)
        client.close()
