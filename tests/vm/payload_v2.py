"""What tests/vm/test_cgroup_v2.py runs inside the VM, as the user (uid 1000) under the user's
systemd manager, with the checkout on PYTHONPATH and plain Debian Python (no pytest):

    python3 payload_v2.py RESULTS_JSON WORK_DIR

Each check records what it saw in RESULTS_JSON (written after each one, so a VM that dies
half-way still tells how far it got); the test asserts on them. Every hog is bounded (its
scope's limit and a maximum of its own) and killed in a ``finally``; every wait is a poll
with a bound.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from trayapp.config.paths import get_paths  # noqa: E402
from trayapp.engine.client import EngineClient, EngineUnavailable  # noqa: E402
from trayapp.jobs import cgroups  # noqa: E402
from trayapp.jobs.scopes import ScopeCgroup  # noqa: E402

MiB = 1 << 20
GATED_HOG = str(REPO / "tests" / "scripts" / "brake" / "gated_hog.py")
results: Dict[str, Any] = {}
OUT = Path(sys.argv[1])
WORK = Path(sys.argv[2])


def save() -> None:
    OUT.write_text(json.dumps(results, indent=2, default=str))


def wait_for(what: str, check: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:g} s")
        time.sleep(0.05)


def progress_mib(path: Path) -> float:
    try:
        return float(path.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return 0.0


def hog(name: str, max_mb: int, gate_open: bool = False) -> Dict[str, Any]:
    progress, gate = WORK / f"{name}.progress", WORK / f"{name}.gate"
    if gate_open:
        gate.touch()
    p = subprocess.Popen([sys.executable, GATED_HOG, "10", "0", str(max_mb), str(progress),
                          str(gate)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return {"popen": p, "progress": progress, "gate": gate}


def kill(p: Optional[subprocess.Popen], scope: Optional[ScopeCgroup] = None) -> None:
    if scope is not None:
        try:
            scope.kill()
        except Exception:
            pass
    if p is not None and p.poll() is None:
        p.send_signal(signal.SIGKILL)
        p.wait(30)


def check(name: str) -> Callable[[Callable[[Dict[str, Any]], None]], None]:
    def run(body: Callable[[Dict[str, Any]], None]) -> None:
        seen: Dict[str, Any] = {}
        results[name] = seen
        try:
            body(seen)
            seen["ok"] = True
        except Exception:
            seen["error"] = traceback.format_exc(limit=4)
        save()
    return run


OFFER = cgroups.detect()
results["offer"] = OFFER.to_json()
results["plan_line"] = cgroups.plan_line(True, 200, OFFER)
save()


@check("brake")
def _brake(seen: Dict[str, Any]) -> None:
    """A scope's memory.high holds a hog: it stalls at its limit, high events rise, no OOM
    kill; freezing stops it (frozen 1), thawing lets it go on."""
    h = hog("brake", 400)
    scope = None
    try:
        scope = ScopeCgroup.start(OFFER, "lowlevel", h["popen"].pid)
        seen["folder"] = scope.memory
        seen["in_scope"] = h["popen"].pid in scope.pids()
        scope.set_limit(150 * MiB)
        seen["memory_max"] = Path(scope.memory, "memory.max").read_text().strip()
        h["gate"].touch()
        first = wait_for("a hold at memory.high", lambda: (lambda r: r if r.under_oom else None)(
            scope.read()), 90)
        later = wait_for("high events rising", lambda: (
            lambda r: r if (r.high_events or 0) > (first.high_events or 0) else None)(
            scope.read()), 30)
        seen["first"], seen["later"] = first.to_json(), later.to_json()
        seen["progress_mib"] = progress_mib(h["progress"])
        seen["alive"] = h["popen"].poll() is None
        seen["peak"] = scope.peak()
        scope.freeze()
        seen["frozen_state"] = wait_for("frozen", lambda: scope.freezer_state() == "FROZEN", 60)
        seen["events_frozen"] = Path(scope.memory, "cgroup.events").read_text()
        scope.thaw()
        seen["thawed_state"] = wait_for("thawed", lambda: scope.freezer_state() == "THAWED", 30)
        scope.set_limit(300 * MiB)  # raised: it goes on
        seen["went_on_to"] = wait_for("the hog to go on", lambda: (
            lambda mb: mb if mb >= 250 else None)(progress_mib(h["progress"])), 60)
        seen["oom_kill_after"] = scope.read().oom_kill
    finally:
        kill(h["popen"], scope)


@check("max_only")
def _max_only(seen: Dict[str, Any]) -> None:
    """With memory.max alone (no brake) the kernel's OOM killer ends the hog, and that is read
    as an OOM kill (memory.events, or the scope's result once it is gone)."""
    h = hog("max", 400)
    scope = None
    try:
        scope = ScopeCgroup.start(OFFER, "maxonly", h["popen"].pid)
        start = scope.read().oom_kill
        Path(scope.memory, "memory.high").write_text("max")
        Path(scope.memory, "memory.max").write_text(str(150 * MiB))
        h["gate"].touch()
        seen["returncode"] = wait_for("the OOM kill", lambda: h["popen"].poll(), 90)
        seen["oom_killed_at"] = scope.oom_killed(start)
    finally:
        kill(h["popen"], scope)


def engine_env(home: Path) -> Dict[str, str]:
    env = dict(os.environ)
    env["HEADROOM_HOME"] = str(home)
    env["PYTHONPATH"] = str(REPO)
    return env


@check("engine")
def _engine(seen: Dict[str, Any]) -> None:
    """A real engine in a scope of the user's manager (as a desktop starts it): a hog job
    with a RAM budget is held at it by the kernel, in a scope of its own, paused, and never
    OOM-killed; what every surface says of its protection; a scope removed under a second
    job is one line, and the guard goes on with it."""
    home = WORK / "home"
    home.mkdir(mode=0o700)
    env = engine_env(home)
    stderr = open(WORK / "engine.stderr", "wb")
    engine = subprocess.Popen(["systemd-run", "--user", "--scope", "--quiet",
                               "--unit=headroom-engine-test", sys.executable, "-m", "trayapp",
                               "engine", "--stay", "--metrics", "127.0.0.1:9477"],
                              env=env, stdout=subprocess.DEVNULL, stderr=stderr,
                              cwd=str(REPO))
    os.environ["HEADROOM_HOME"] = str(home)
    paths = get_paths()
    client: Optional[EngineClient] = None
    job_ids: List[str] = []
    try:

        def connect() -> Optional[EngineClient]:
            if engine.poll() is not None:
                raise RuntimeError(f"the engine exited with {engine.returncode}")
            try:
                c = EngineClient(paths, timeout=5.0)
                c.ping()
                return c
            except EngineUnavailable:
                return None

        client = wait_for("the engine", connect, 120)
        status = client.status()
        seen["status_protection"] = dict(status.engine.protection) or None
        progress, gate = WORK / "job.progress", WORK / "job.gate"
        gate.touch()
        job_id = client.job_start({"script": GATED_HOG, "python": sys.executable,
                                   "args": ["10", "0", "500", str(progress), str(gate)],
                                   "ram_budget_mb": 200}).id
        job_ids.append(job_id)
        job = wait_for("the job paused or ended", lambda: (
            lambda j: j if j.state in ("paused", "finished", "failed", "stopped", "lost",
                                          "parked") else None)(client.job_get(job_id)), 120)
        seen["job"] = {k: job.to_json().get(k) for k in ("state", "paused_by", "protection",
                                               "memory_method", "cgroup_memory", "pid",
                                               "rss_bytes", "end_reason")}
        pid = int(job.pid or 0)
        seen["job_cgroup"] = Path(f"/proc/{pid}/cgroup").read_text().strip()
        seen["job_events"] = [e.message for e in client.events(limit=200)
                              if e.job_id == job_id]
        seen["progress_mib"] = progress_mib(progress)
        said = subprocess.run([sys.executable, "-m", "trayapp", "jobs"], env=env,
                              capture_output=True, text=True, timeout=60, cwd=str(REPO))
        seen["jobs_cli"] = said.stdout + said.stderr
        said = subprocess.run([sys.executable, "-m", "trayapp", "status"], env=env,
                              capture_output=True, text=True, timeout=60, cwd=str(REPO))
        seen["status_cli"] = said.stdout + said.stderr
        try:
            import urllib.request
            with urllib.request.urlopen("http://127.0.0.1:9477/metrics", timeout=10) as r:
                seen["metrics"] = [line for line in r.read().decode().splitlines()
                                   if line.startswith("headroom_job_protection_info")]
        except Exception as e:
            seen["metrics"] = f"unreadable: {e}"
        client.job_action(job_id, "kill")

        # A scope removed under a running job: its process moved out (as another program
        # could), the manager collects the empty scope; one line, the guard goes on.
        progress2, gate2 = WORK / "job2.progress", WORK / "job2.gate"
        job2 = client.job_start({"script": GATED_HOG, "python": sys.executable,
                                 "args": ["10", "30", "60", str(progress2), str(gate2)],
                                 "ram_budget_mb": 300}).id
        job_ids.append(job2)
        wait_for("30 MiB allocated", lambda: progress_mib(progress2) >= 30, 60)
        wait_for("its scope's reading", lambda: client.job_get(job2).memory_method
                 == "cgroup", 60)
        pid2 = int(client.job_get(job2).pid or 0)
        path = Path(f"/proc/{pid2}/cgroup").read_text().strip().split("::", 1)[1]
        folder = Path("/sys/fs/cgroup" + path)
        service = Path(OFFER.memory_parent or "")
        for p in (folder / "cgroup.procs").read_text().split():
            (service / "init.scope" / "cgroup.procs").write_text(p)
        seen["scope_gone"] = wait_for("the scope collected", lambda: not folder.exists(), 60)
        gone = wait_for("the engine to see it", lambda: (
            lambda j: j if (j.protection or "").startswith("none: the guard only")
            else None)(client.job_get(job2)), 60)
        seen["job2"] = {k: gone.to_json().get(k) for k in ("state", "protection", "pid")}
        gate2.touch()
        seen["job2_went_on_to"] = wait_for("the job to go on", lambda: (
            lambda mb: mb if mb >= 60 else None)(progress_mib(progress2)), 60)
        seen["job2_state"] = client.job_get(job2).state
        seen["job2_alive"] = os.path.exists(f"/proc/{pid2}")
    finally:
        for jid in job_ids:
            try:
                if client is not None:
                    client.job_action(jid, "kill")
            except Exception:
                pass
        if client is not None:
            client.close()
        if engine.poll() is None:
            engine.send_signal(signal.SIGTERM)
            try:
                engine.wait(30)
            except subprocess.TimeoutExpired:
                engine.kill()
                engine.wait(10)
        stderr.close()
        seen["engine_stderr"] = (WORK / "engine.stderr").read_text(errors="replace")[-6000:]


results["done"] = True
save()
