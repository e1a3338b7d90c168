"""The kernel brake for real, on this machine's cgroup v1: real engines, real jobs in cgroups
of their own, hogs held at their limit by the kernel (never by its OOM killer), forks frozen
during a pause, a cgroup removed under a running job, a budget below what a job uses, and a
Keras job whose step does not fit under its budget, relaunched smaller until it finishes.

Skipped where the engine's memory cgroup takes no child (no root, no v1, a read-only
cgroupfs). Every hog is bounded (a budget, its cgroup's limit, a maximum of its own) and killed
in a ``finally``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import psutil
import pytest

from tests.conftest import REPO, EngineProcess, run_cli
from tests.integration.test_guard_e2e import HOG, engine_in_cgroup, wait_for, wait_state
from trayapp.config import Paths
from trayapp.engine.client import EngineClient
from trayapp.engine.event_record import EngineEvent
from trayapp.jobs import cgroups
from trayapp.jobs.options import JobSpec
from trayapp.vocab import EventKind as E
from trayapp.vocab import JobState as S

MiB = 1 << 20
PAGE = 4096
SCRIPTS = REPO / "tests" / "scripts"
GATED_HOG = str(SCRIPTS / "brake" / "gated_hog.py")
FORKING = str(SCRIPTS / "brake" / "forking.py")
WIDE_FIT = str(SCRIPTS / "runner" / "wide_fit.py")
ENDED = {S.FINISHED, S.FAILED, S.STOPPED, S.LOST, S.PARKED}
OFFER = cgroups.detect() if sys.platform.startswith("linux") else cgroups.Offer(cgroups.NONE)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not OFFER.brakes, reason=f"no kernel brake here: {OFFER.why}")]


# -- helpers ---------------------------------------------------------------------------------------


def job_cgroup(job_id: str) -> Path:
    assert OFFER.memory_parent is not None
    return Path(OFFER.memory_parent) / f"{cgroups.PREFIX}{job_id}"


def job_freezer(job_id: str) -> Path:
    assert OFFER.freezer_parent is not None
    return Path(OFFER.freezer_parent) / f"{cgroups.PREFIX}{job_id}"


def read_int(folder: Path, name: str) -> int:
    return int((folder / name).read_text().split()[0])


def oom_control(folder: Path) -> Dict[str, int]:
    return cgroups.parse_keyed((folder / "memory.oom_control").read_text())


def progress_mib(path: Path) -> float:
    try:
        return float(path.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return 0.0


def events(client: EngineClient, job_id: str) -> List[EngineEvent]:
    return [e for e in client.events(limit=500) if e.job_id == job_id]


def kill_job(client: EngineClient, job_id: Optional[str],
             pids: Optional[List[int]] = None) -> None:
    """Kill a test's job, through the engine and (the engine may be gone) by its pids."""
    pids = list(pids or [])
    if job_id is not None:
        try:
            client.job_action(job_id, "kill")
        except Exception:
            pass
        folder = job_cgroup(job_id)
        try:
            pids = [*pids, *(int(p) for p in (folder / "cgroup.procs").read_text().split())]
        except OSError:
            pass
        try:
            (job_freezer(job_id) / "freezer.state").write_text("THAWED")
        except (OSError, AssertionError):
            pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def remove_cgroup(folder: Path) -> None:
    """Move what is left in a test's cgroup (and the job cgroups in it) up, then remove it."""
    for child in (c for c in folder.glob(f"{cgroups.PREFIX}*") if c.is_dir()):
        remove_cgroup(child)
    if not folder.exists():
        return
    for _ in range(50):
        for pid in (folder / "cgroup.procs").read_text().split():
            try:
                (folder.parent / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        try:
            folder.rmdir()
            return
        except OSError:
            time.sleep(0.1)
    folder.rmdir()


def states(pids: List[int]) -> Dict[int, str]:
    out = {}
    for pid in pids:
        try:
            out[pid] = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
    return out


@pytest.fixture
def client_of(start_engine: Callable[..., EngineProcess]) -> Iterator[Callable[..., Any]]:
    clients: List[EngineClient] = []

    def make(engine: EngineProcess) -> EngineClient:
        c = engine.client()
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()


# -- a hog with a budget -------------------------------------------------------------------------


def test_a_hog_is_held_at_its_budget_by_the_kernel_never_killed(
        start_engine: Callable[..., EngineProcess], client_of: Any, tmp_path: Path) -> None:
    engine = start_engine()
    client = client_of(engine)
    progress, gate = tmp_path / "progress", tmp_path / "gate"
    gate.touch()
    budget = 200 * MiB
    job_id = None
    try:
        # 10 MiB chunks as fast as it can, at most 600 MiB: held at 200 MiB by its cgroup.
        job_id = client.job_start({"script": GATED_HOG, "python": sys.executable,
                                   "args": ["10", "0", "600", str(progress), str(gate)],
                                   "ram_budget_mb": 200}).id
        job = wait_state(client, job_id, {S.PAUSED} | ENDED, 60)
        assert job.state == S.PAUSED and job.paused_by == "guard", job
        assert job.protection == "kernel brake (cgroup v1)"
        folder = job_cgroup(job_id)
        held = wait_for("the kernel's hold, said", lambda: [
            e for e in events(client, job_id) if e.kind == E.JOB_NOTE
            and "is held by the kernel at its cgroup's limit of 200.0 MiB" in e.message], 30)
        assert "(its budget of 200.0 MiB)" in held[0].message
        assert oom_control(folder) == {"oom_kill_disable": 1, "under_oom": 1, "oom_kill": 0}
        assert read_int(folder, "memory.limit_in_bytes") == budget
        assert read_int(folder, "memory.max_usage_in_bytes") <= budget + PAGE
        assert progress_mib(progress) < 200
        assert psutil.pid_exists(job.pid or 0) and job.rss_bytes is not None
        assert job.memory_method == "cgroup" and job.cgroup_memory is not None
        assert job.cgroup_memory["anon_bytes"] > 150 * MiB
    finally:
        kill_job(client, job_id)


def test_forks_during_a_pause_are_frozen_too(
        start_engine: Callable[..., EngineProcess], client_of: Any, tmp_path: Path) -> None:
    engine = start_engine()
    client = client_of(engine)
    report, stop = tmp_path / "daemon", tmp_path / "stop"
    job_id = None
    try:
        job_id = client.job_start({"script": FORKING, "python": sys.executable,
                                   "args": [str(report), str(stop)]}).id
        daemon = int(wait_for("the daemon", lambda: report.exists() and report.read_text(), 30))
        folder, freezer = job_cgroup(job_id), job_freezer(job_id)
        procs = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
        assert daemon in procs  # left the tree, still in the job's cgroup
        # Every surface says what guards it.
        assert client.status().engine.protection["words"] == "kernel brake (cgroup v1)"
        assert "Protection kernel brake (cgroup v1)" in run_cli("status", timeout=60).stdout
        row = [line for line in run_cli("jobs", timeout=60).stdout.splitlines()
               if line.startswith(job_id)]
        assert row and row[0].split()[-1] == "brake-v1", row
        client.job_action(job_id, "pause")
        wait_state(client, job_id, {S.PAUSED}, 30)
        wait_for("the freezer", lambda: (freezer / "freezer.state").read_text().strip()
                 == "FROZEN", 30)
        procs = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
        frozen = states(procs)
        assert daemon in frozen and set(frozen.values()) == {"D"}, frozen  # frozen: D
        assert client.job_get(job_id).pause_mode == "suspended"
        # A SIGKILL from anyone to a frozen process ends it (the v1 freezer would hold it):
        # the rest of the job stays paused, stopped by signal.
        os.kill(daemon, signal.SIGKILL)
        wait_for("the daemon killed", lambda: daemon not in [
            int(p) for p in (folder / "cgroup.procs").read_text().split()], 30)
        rest = states([int(p) for p in (folder / "cgroup.procs").read_text().split()])
        assert rest and set(rest.values()) <= {"T", "D"}, rest
        assert (freezer / "freezer.state").read_text().strip() == "THAWED"
        assert client.job_get(job_id).state == S.PAUSED
        client.job_action(job_id, "resume")
        wait_for("the job to run again", lambda: set(states([
            int(p) for p in (folder / "cgroup.procs").read_text().split()]).values()) <=
            {"S", "R"}, 30)
        stop.touch()
        job = wait_state(client, job_id, ENDED, 60)
        assert job.state == S.FINISHED, job
        wait_for("its cgroups removed", lambda: not folder.exists() and not freezer.exists(),
                 30)
    finally:
        stop.touch()
        kill_job(client, job_id)


def test_a_cgroup_removed_under_a_running_job_leaves_it_to_the_guard(
        start_engine: Callable[..., EngineProcess], client_of: Any, tmp_path: Path) -> None:
    engine = start_engine()
    client = client_of(engine)
    progress, gate = tmp_path / "progress", tmp_path / "gate"
    job_id = None
    try:
        job_id = client.job_start({"script": GATED_HOG, "python": sys.executable,
                                   "args": ["10", "30", "60", str(progress), str(gate)],
                                   "ram_budget_mb": 300}).id
        wait_for("30 MiB allocated", lambda: progress_mib(progress) >= 30, 30)
        wait_for("its cgroup's reading", lambda: client.job_get(job_id).memory_method
                 == "cgroup", 30)
        folder = job_cgroup(job_id)
        parent = folder.parent
        for pid in (folder / "cgroup.procs").read_text().split():
            (parent / "cgroup.procs").write_text(pid)
        folder.rmdir()  # as another program could
        job = wait_for("the engine to see it", lambda: (
            lambda j: j if (j.protection or "").startswith("none: the guard only")
            else None)(client.job_get(job_id)), 30)
        assert job.protection == f"none: the guard only (its cgroup {folder} is gone)"
        assert job.state == S.RUNNING and psutil.pid_exists(job.pid or 0)
        wait_for("the guard's own reading", lambda: client.job_get(job_id).memory_method
                 not in (None, "cgroup"), 30)
        gate.touch()
        wait_for("the job to go on", lambda: progress_mib(progress) >= 60, 30)
        lines = [line for line in engine.stderr.splitlines() if "is gone" in line]
        assert len(lines) == 1 and "the kernel brake is off for it, the guard goes on" in \
            lines[0], lines
        assert client.job_get(job_id).state == S.RUNNING
    finally:
        kill_job(client, job_id)


def test_a_budget_below_what_an_adopted_job_uses_keeps_its_limit_above_its_use(
        start_engine: Callable[..., EngineProcess], client_of: Any, tmp_path: Path) -> None:
    """An engine's job, held at its budget, its limit lifted by hand while no engine watched,
    grown past its budget: the next engine takes it back with its cgroup, says in one line
    that the budget is below what it uses, keeps the limit a margin above the use (the job
    does not stall for it) and the guard pauses it, as without the brake."""
    first = start_engine()
    client = client_of(first)
    progress, gate = tmp_path / "progress", tmp_path / "gate"
    job_id, pid = None, 0
    try:
        job_id = client.job_start({"script": GATED_HOG, "python": sys.executable,
                                   "args": ["10", "30", "250", str(progress), str(gate)],
                                   "ram_budget_mb": 150}).id
        pid = int(client.job_get(job_id).pid)
        wait_for("30 MiB allocated", lambda: progress_mib(progress) >= 30, 30)
        folder = job_cgroup(job_id)
        wait_for("its limit", lambda: read_int(folder, "memory.limit_in_bytes") == 150 * MiB,
                 30)
        first.kill()  # the job runs on, in its cgroup
        (folder / "memory.limit_in_bytes").write_text("-1")
        gate.touch()
        wait_for("250 MiB allocated", lambda: progress_mib(progress) >= 250, 30)
        used = read_int(folder, "memory.usage_in_bytes")
        assert used > 240 * MiB
        second = start_engine()
        client = client_of(second)
        job = wait_state(client, job_id, {S.PAUSED}, 30)
        assert job.paused_by == "guard" and job.protection == "kernel brake (cgroup v1)"
        limit = read_int(folder, "memory.limit_in_bytes")
        assert used <= limit <= used + cgroups.MARGIN_BYTES + cgroups.WRITE_STEP_BYTES
        lines = [line for line in second.stderr.splitlines() if "below what it already" in line]
        assert len(lines) == 1, lines
        assert "its RAM budget of 150.0 MiB is below what it already uses" in lines[0]
        assert oom_control(folder)["oom_kill"] == 0 and psutil.pid_exists(pid)
    finally:
        kill_job(client, job_id, [pid] if pid else [])


# -- a Keras job whose step does not fit ---------------------------------------------------------


@pytest.mark.tensorflow
def test_a_keras_step_over_its_budget_is_braked_and_relaunched_smaller(
        start_engine: Callable[..., EngineProcess], client_of: Any, tmp_path: Path) -> None:
    """wide_fit's cgroup peaks at about 1.3 GiB at batch 4096 and 0.8 GiB at 2048 (measured;
    its RSS, 1.6 and 1.1 GB, counts shared library pages its cgroup is not charged for): held
    at 1100 MiB in its first step, it is relaunched at 2048 x 2 and does the whole training."""
    engine = start_engine()
    client = client_of(engine)
    out, ckpt, ref = tmp_path / "report.json", tmp_path / "ckpt", tmp_path / "reference.json"
    spec = JobSpec(fit_batch=False, script=WIDE_FIT, args=(str(out), "4096", "2"),
                   python=sys.executable,
                   ram_budget_mb=1100, checkpoint_dir=str(ckpt))
    job_id = client.job_start(spec.to_json()).id
    plain = subprocess.Popen([sys.executable, WIDE_FIT, str(ref), "4096", "2"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        job = wait_state(client, job_id, ENDED, 400)
        said = events(client, job_id)
        messages = [e.message for e in said]
        assert job.state == S.FINISHED, (job, messages)
        braked = [e for e in said if e.kind == E.JOB_BRAKED]
        assert braked, messages
        assert braked[0].message == (
            f"job {job_id} (wide_fit) stalled at its cgroup's limit of 1.1 GiB; relaunched "
            "from its checkpoint at micro-batches of 2048 x 2 (the same training)")
        assert not any("OOM killer" in m for m in messages)
        assert (job.batch, job.micro_batch, job.accumulation) == (4096, 2048, 2)
        assert job.cgroup_memory is not None and job.cgroup_memory["oom_kill"] == 0
        report = json.loads(out.read_text())
        assert report["updates"] == 2 * 2 and report["accumulation"] == 2
        _, err = plain.communicate(timeout=400)
        assert plain.returncode == 0, err[-2000:]
        expected = json.loads(ref.read_text())
        assert report["updates"] == expected["updates"]
        assert report["weights"] == pytest.approx(expected["weights"], rel=1e-4)
    finally:
        if plain.poll() is None:
            plain.kill()
            plain.wait()
        if plain.stderr is not None:  # a test that failed early never read it
            plain.stderr.close()
        kill_job(client, job_id)


def test_empty_job_cgroups_an_engine_left_are_removed(
        start_engine: Callable[..., EngineProcess], client_of: Any, tmp_path: Path) -> None:
    """Jobs killed while no engine watched them leave their cgroups behind, empty: the next
    engine to give a job its cgroups removes them. The engine runs in cgroups of its own, so
    that no other test's engine sweeps these first."""
    assert OFFER.memory_parent is not None and OFFER.freezer_parent is not None
    own = [Path(parent) / f"headroom-test-sweep-{os.getpid()}"
           for parent in (OFFER.memory_parent, OFFER.freezer_parent)]
    stale = [folder / f"{cgroups.PREFIX}0badc0de" for folder in own]
    for folder in own + stale:
        folder.mkdir(exist_ok=True)
    engine = start_engine(cgroups=own)
    client = client_of(engine)
    job_id = None
    try:
        job_id = client.job_start({"script": FORKING, "python": sys.executable,
                                   "args": [str(tmp_path / "daemon"), str(tmp_path / "stop")]
                                   }).id
        assert not any(folder.exists() for folder in stale)
        assert (own[0] / f"{cgroups.PREFIX}{job_id}").is_dir()
        # Said in its log (read from its stderr as it comes: the line may follow the removal).
        wait_for("the engine to say it removed them",
                 lambda: "empty job cgroups an earlier engine left" in engine.stderr, 20)
    finally:
        (tmp_path / "stop").touch()
        kill_job(client, job_id)
        engine.stop()
        for parent in own:  # whatever is left below (the job's, were it still there), then it
            for folder in [*parent.glob(f"{cgroups.PREFIX}*"), parent]:
                if folder.is_dir():
                    folder.rmdir()


# -- the kernel's OOM killer ---------------------------------------------------------------------


def test_a_job_the_oom_killer_ended_is_said_so_with_the_cause(paths: Paths,
                                                              tmp_path: Path) -> None:
    """An engine in a cgroup of 800 MiB, its job holding 250 MiB, and another program in the
    same cgroup taking the rest: the cgroup's OOM killer ends the job (its oom_score_adj is
    raised). The engine tells it from a job that failed by itself: SIGKILL with its cgroup's
    oom_kill counter risen. A hog cannot train smaller: it is not relaunched, and says why."""
    assert OFFER.memory_parent is not None
    parent = Path(OFFER.memory_parent) / f"headroom-test-oom-{os.getpid()}-{time.monotonic_ns()}"
    parent.mkdir()
    progress, gate = tmp_path / "progress", tmp_path / "gate"
    (paths.home / "config.toml").write_text('[guard]\nmode = "off"\n')  # the kernel alone
    other: Optional[subprocess.Popen] = None
    job_id, pid = None, 0
    client: Optional[EngineClient] = None
    try:
        (parent / "memory.limit_in_bytes").write_text(str(800 * MiB))
        with engine_in_cgroup(paths, parent):
            client = EngineClient(paths)
            job = client.job_start({"script": GATED_HOG, "python": sys.executable,
                                    "args": ["10", "250", "260", str(progress), str(gate)]})
            job_id, pid = job.id, int(job.pid)
            wait_for("250 MiB held", lambda: progress_mib(progress) >= 250, 30)
            folder = parent / f"{cgroups.PREFIX}{job_id}"
            assert oom_control(folder)["oom_kill"] == 0
            wrapper = ("import os, sys\n"
                       f"open({str(parent / 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
                       f"os.execv(sys.executable, [sys.executable, {HOG!r}, '10', '200', "
                       "'600'])\n")
            other = subprocess.Popen([sys.executable, "-c", wrapper],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            ended = wait_state(client, job_id, ENDED, 60)
            assert ended.state == S.FAILED and ended.exit_code == -signal.SIGKILL, ended
            assert (ended.end_reason or "").startswith("the kernel's OOM killer ended it at ")
            assert "; not relaunched: it does not report to Headroom (no Keras fit hooked)" in \
                (ended.end_reason or "")
            said = [e for e in client.events(limit=200) if e.job_id == job_id
                    and e.kind == E.JOB_FAILED]
            assert said and "the kernel's OOM killer ended it" in said[0].message
            # The job was the kernel's choice (its oom_score_adj raised; its cgroup's count of
            # kills rose, or the reason above would not say so). The kernel may take the other
            # program as well: a killed process with threads (the runner's) lets its pages go
            # in its last thread's exit, and a charge that fails before then finds no victim
            # left in the cgroup and ends the next one. That is the kernel's; with the guard
            # on, the job's own limit keeps such a kill inside the job's cgroup.
            assert other.poll() in (None, -signal.SIGKILL)
    finally:
        gate.touch()
        if other is not None and other.poll() is None:
            other.kill()
            other.wait(10)
        if client is not None:
            kill_job(client, job_id, [pid] if pid else [])
            client.close()
        remove_cgroup(parent)


@pytest.mark.tensorflow
def test_a_keras_job_the_oom_killer_ended_is_relaunched_smaller(paths: Paths,
                                                               tmp_path: Path) -> None:
    """The same in a cgroup of 1100 MiB, the job a Keras fit at batch 1024 (about 540 MiB in
    its cgroup): once the other program has taken the room, the OOM killer ends the job, and
    the engine relaunches it at once at 512 x 2 from its checkpoint folder (restored as saved,
    at 1024, then switched); it finishes with the training plain python gives."""
    assert OFFER.memory_parent is not None
    parent = Path(OFFER.memory_parent) / f"headroom-test-oom-{os.getpid()}-{time.monotonic_ns()}"
    parent.mkdir()
    out, ckpt = tmp_path / "report.json", tmp_path / "ckpt"
    (paths.home / "config.toml").write_text('[guard]\nmode = "off"\n')  # the kernel alone
    other: Optional[subprocess.Popen] = None
    job_id = None
    client: Optional[EngineClient] = None
    epochs = 8
    try:
        (parent / "memory.limit_in_bytes").write_text(str(1100 * MiB))
        with engine_in_cgroup(paths, parent):
            client = EngineClient(paths)
            spec = JobSpec(fit_batch=False, script=WIDE_FIT, args=(str(out), "1024", str(epochs)),
                           python=sys.executable, checkpoint_dir=str(ckpt))
            job_id = client.job_start(spec.to_json()).id
            wait_for("the fit's batch", lambda: client.job_get(job_id).shrinkable, 120)
            wrapper = ("import os, sys\n"
                       f"open({str(parent / 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
                       f"os.execv(sys.executable, [sys.executable, {HOG!r}, '10', '200', "
                       "'600'])\n")
            other = subprocess.Popen([sys.executable, "-c", wrapper],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            braked = wait_for("the relaunch", lambda: [
                e for e in client.events(limit=200)
                if e.job_id == job_id and e.kind == E.JOB_BRAKED], 120)
            other.kill()  # the room back for the relaunched job
            other.wait(10)
            message = braked[0].message
            assert message.startswith(f"job {job_id} (wide_fit) the kernel's OOM killer ended "
                                      "it at "), message
            assert message.endswith("relaunched from its checkpoint at micro-batches of "
                                    "512 x 2 (the same training)"), message
            job = wait_state(client, job_id, ENDED, 300)
            assert job.state == S.FINISHED, job
            assert (job.batch, job.micro_batch, job.accumulation) == (1024, 512, 2)
            report = json.loads(out.read_text())
            assert report["updates"] == epochs * 8  # 8192 samples at 1024: 8 updates an epoch
        # The training plain python gives, outside the cgroup, once the job is done.
        ref = tmp_path / "reference.json"
        subprocess.run([sys.executable, WIDE_FIT, str(ref), "1024", str(epochs)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
        expected = json.loads(ref.read_text())
        assert report["updates"] == expected["updates"]
        assert report["weights"] == pytest.approx(expected["weights"], rel=1e-4)
    finally:
        if other is not None and other.poll() is None:
            other.kill()
            other.wait(10)
        if client is not None:
            kill_job(client, job_id)
            client.close()
        remove_cgroup(parent)


def test_a_frozen_job_is_left_paused_by_signal_when_the_engine_goes(
        start_engine: Callable[..., EngineProcess], client_of: Any, tmp_path: Path) -> None:
    """A task in the v1 freezer does not die of SIGKILL until thawed: an engine going away
    leaves its frozen jobs stopped by signal instead (paused still, killable by anyone), and
    the next engine resumes them, those that left the tree too."""
    first = start_engine()
    client = client_of(first)
    report, stop = tmp_path / "daemon", tmp_path / "stop"
    job_id = None
    try:
        job_id = client.job_start({"script": FORKING, "python": sys.executable,
                                   "args": [str(report), str(stop)]}).id
        daemon = int(wait_for("the daemon", lambda: report.exists() and report.read_text(), 30))
        folder, freezer = job_cgroup(job_id), job_freezer(job_id)
        client.job_action(job_id, "pause")
        wait_for("the freezer", lambda: (freezer / "freezer.state").read_text().strip()
                 == "FROZEN", 30)
        assert first.stop() == 0
        assert (freezer / "freezer.state").read_text().strip() == "THAWED"
        procs = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
        assert daemon in procs and set(states(procs).values()) == {"T"}, states(procs)
        second = start_engine()
        client = client_of(second)
        assert client.job_get(job_id).state == S.PAUSED
        client.job_action(job_id, "resume")
        wait_for("all of it to run again", lambda: set(states([
            int(p) for p in (folder / "cgroup.procs").read_text().split()]).values()) <=
            {"S", "R"}, 30)
        stop.touch()
        wait_for("the job to end", lambda: client.job_get(job_id).state in ENDED, 60)
    finally:
        stop.touch()
        kill_job(client, job_id)
