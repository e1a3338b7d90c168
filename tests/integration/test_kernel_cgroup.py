"""A Jupyter kernel in a cgroup of its own, for real on this machine's cgroup v1: a kernel started
by jupyter_client from Headroom's kernel spec is adopted by a real engine, which moves it into
its own memory cgroup; a cell that allocates past the kernel's budget is held there by the
kernel (never by its OOM killer: a kernel's variables live in its process), and the note says
so and how to go on.

Skipped where the engine's memory cgroup takes no child. The hog cell is bounded (the budget,
the cgroup's limit, and a maximum of its own) and the kernel is killed in a ``finally``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List

import psutil
import pytest

pytest.importorskip("jupyter_client")

from tests.conftest import EngineProcess, end_processes_of, run_cli, wait_for  # noqa: E402
from tests.integration.test_kernel import close, install_spec, kernel_job, start_kernel  # noqa: E402
from tests.integration.test_kernel_brake import (  # noqa: E402
    OFFER,
    job_cgroup,
    kill_job,
    oom_control,
    read_int,
)
from trayapp.config import get_paths  # noqa: E402
from trayapp.jobs import cgroups  # noqa: E402
from trayapp.vocab import EventKind as E  # noqa: E402

MiB = 1 << 20
BUDGET_MIB = 600
# At most this much in all (10 MiB blocks, each page written): past the budget, bounded.
HOG_MAX_MIB = BUDGET_MIB + 300
HOG = f"""
blocks = []
for _ in range({HOG_MAX_MIB // 10}):
    b = bytearray(10 << 20)
    b[::4096] = b"\\x01" * len(b[::4096])
    blocks.append(b)
print("never held")
"""

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not OFFER.brakes, reason=f"no kernel brake here: {OFFER.why}")]


def own_memory_cgroup(pid: int) -> str:
    text = Path(f"/proc/{pid}/cgroup").read_text()
    return cgroups.own_cgroups(text).get("memory", "")


def test_an_adopted_kernel_is_held_at_its_budget_in_its_own_cgroup(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    prefix = tmp_path / "prefix"
    install_spec(home, prefix, "hrb", "--ram-budget", str(BUDGET_MIB))
    old = os.environ.get("HEADROOM_HOME")
    os.environ["HEADROOM_HOME"] = str(home)
    engine = EngineProcess(get_paths()).wait_ready()
    km = kc = None
    job_id = None
    pid = 0
    try:
        km, kc = start_kernel(prefix, "hrb", str(tmp_path / "hog.ipynb"))
        pid = int(km.provisioner.process.pid)  # type: ignore[union-attr]
        with engine.client() as client:
            job: Dict[str, Any] = wait_for(lambda: kernel_job(client, pid), 60,
                                           "the kernel's job")
            job_id = job["id"]
            start_rss = psutil.Process(pid).memory_info().rss
            assert start_rss < (BUDGET_MIB - 200) * MiB, start_rss  # room to grow into

            # Adopted into a memory cgroup of its own, and every surface says so.
            folder = job_cgroup(job_id)
            assert own_memory_cgroup(pid).endswith(f"/{cgroups.PREFIX}{job_id}")
            assert str(pid) in (folder / "cgroup.procs").read_text().split()
            assert job["protection"] == "kernel brake (cgroup v1)"
            listed = run_cli("jobs", env={"HEADROOM_HOME": str(home)})
            assert listed.returncode == 0, listed.stderr
            assert "brake-v1" in next(line for line in listed.stdout.splitlines()
                                      if job_id in line)
            status = run_cli("status", env={"HEADROOM_HOME": str(home)})
            assert "kernel brake (cgroup v1)" in status.stdout, status.stdout
            # Its limit counts what it holds where it was: never more than its budget in all.
            limit = wait_for(lambda:
                             read_int(folder, "memory.limit_in_bytes") < cgroups.UNLIMITED
                             and read_int(folder, "memory.limit_in_bytes"), 30,
                             "the kernel's first limit")
            assert limit <= BUDGET_MIB * MiB

            kc.execute(HOG)  # runs on: it is held, it does not return
            notes: List[Dict[str, Any]] = wait_for(lambda: [
                e for e in client.events(limit=500) if e.job_id == job_id
                and e.kind == E.JOB_NOTE and "is held by the kernel" in e.message],
                120, "the note that the kernel holds it")
            note = notes[0].message
            assert note.startswith(f"kernel {job_id} ")
            assert "not relaunched" in note and "the OOM killer does not end it" in note
            assert f"'headroom resume {job_id}'" in note and "interrupt the cell" in note
            assert oom_control(folder)["oom_kill"] == 0
            assert oom_control(folder)["oom_kill_disable"] == 1
            assert psutil.pid_exists(pid)
            # Held at its budget in all: what its cgroup has plus what it held where it was.
            held = read_int(folder, "memory.max_usage_in_bytes")
            assert held <= read_int(folder, "memory.limit_in_bytes") + 4096
            rec = kernel_job(client, pid)
            assert rec["state"] in ("running", "pausing", "paused"), rec
            assert rec["rss_bytes"] <= (BUDGET_MIB + 16) * MiB
            assert rec["cgroup_memory"]["charged_elsewhere_bytes"] >= 0
            assert oom_control(folder)["oom_kill"] == 0
    finally:
        with engine.client() as client:
            kill_job(client, job_id, [pid] if pid else [])
        if km is not None and kc is not None:
            close(km, kc)
        engine.stop()
        end_processes_of(home)
        if old is None:
            os.environ.pop("HEADROOM_HOME", None)
        else:
            os.environ["HEADROOM_HOME"] = old
