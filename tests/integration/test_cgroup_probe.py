"""The memory probe inside a real process in a real memory cgroup limited to 1 GiB.

Needs root and a writable cgroup filesystem; each test says why when it skips. Every cgroup
made here is removed in a ``finally``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]
GiB = 1024**3
MiB = 1024**2

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux cgroups")

# Waits until the test has moved it into the cgroup, allocates, and prints one reading.
CHILD = textwrap.dedent(
    """
    import json, sys
    sys.stdin.readline()
    block = b"\\x01" * (int(sys.argv[1]) * 1024 * 1024)
    from trayapp.probes.memory import MemoryProbe
    print(json.dumps(MemoryProbe().read().to_json()), flush=True)
    sys.stdin.readline()
    """
)


def _mounts() -> List[List[str]]:
    with open("/proc/self/mountinfo") as f:
        return [line.split() for line in f]


def v1_memory_mount() -> Optional[Path]:
    for parts in _mounts():
        sep = parts.index("-")
        if parts[sep + 1] == "cgroup" and "memory" in parts[sep + 3].split(","):
            return Path(parts[4])
    return None


def v2_mount() -> Optional[Path]:
    for parts in _mounts():
        sep = parts.index("-")
        if parts[sep + 1] == "cgroup2":
            return Path(parts[4])
    return None


def own_cgroup_path(v1_controller: Optional[str]) -> str:
    with open("/proc/self/cgroup") as f:
        for line in f:
            hid, controllers, path = line.rstrip("\n").split(":", 2)
            if v1_controller is None and hid == "0":
                return path
            if v1_controller is not None and v1_controller in controllers.split(","):
                return path
    return "/"


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("creating cgroups needs root")


def make_cgroup(parent: Path, name: str) -> Path:
    path = parent / name
    try:
        path.mkdir()
    except OSError as e:
        pytest.skip(f"cannot create a cgroup under {parent}: {e.strerror}")
    return path


def remove_cgroup(path: Path) -> None:
    """rmdir (cgroup directories hold only kernel files); retried while the last task exits."""
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    path.rmdir()


def run_probe_in(cgroup: Path, allocate_mib: int) -> Dict[str, Any]:
    """Start a child, move it into ``cgroup``, and return the probe's reading from inside."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(allocate_mib)], cwd=REPO, env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        (cgroup / "cgroup.procs").write_text(str(child.pid))
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        line = child.stdout.readline()
        assert line, "the child printed no reading"
        return json.loads(line)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(30)
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def v1_parent() -> Iterator[Path]:
    need_root()
    mount = v1_memory_mount()
    if mount is None:
        pytest.skip("no cgroup v1 memory hierarchy on this machine")
    # Nest under this process's own cgroup, so the test stays inside whatever limits it.
    own = mount / own_cgroup_path("memory").lstrip("/")
    yield own if own.is_dir() else mount


def test_v1_limit_of_1_gib(v1_parent: Path) -> None:
    cg = make_cgroup(v1_parent, f"headroom-test-{os.getpid()}")
    try:
        (cg / "memory.limit_in_bytes").write_text(str(GiB))
        r = run_probe_in(cg, 100)
        assert r["limit_source"] == "cgroup"
        assert r["cgroup_version"] == 1
        assert r["total_bytes"] == GiB
        assert r["cgroup_limit_bytes"] == GiB
        assert r["cgroup_used_bytes"] >= 100 * MiB
        assert r["available_bytes"] <= GiB - 100 * MiB
        assert r["used_bytes"] == r["total_bytes"] - r["available_bytes"]
    finally:
        remove_cgroup(cg)


def test_v1_limit_on_the_parent_binds_the_child(v1_parent: Path) -> None:
    outer = make_cgroup(v1_parent, f"headroom-test-{os.getpid()}-outer")
    inner = None
    try:
        (outer / "memory.limit_in_bytes").write_text(str(GiB))
        inner = make_cgroup(outer, "job")
        r = run_probe_in(inner, 64)
        assert (r["limit_source"], r["cgroup_version"]) == ("cgroup", 1)
        assert r["total_bytes"] == GiB
        assert r["cgroup_used_bytes"] >= 64 * MiB
    finally:
        if inner is not None:
            remove_cgroup(inner)
        remove_cgroup(outer)


def test_v2_limit_of_1_gib() -> None:
    need_root()
    mount = v2_mount()
    if mount is None:
        pytest.skip("no cgroup v2 hierarchy on this machine")
    controllers = (mount / "cgroup.subtree_control").read_text().split()
    if "memory" not in controllers:
        pytest.skip(f"the v2 hierarchy at {mount} does not have the memory controller "
                    "(memory is on v1 here)")
    # Directly under the root: the root is exempt from v2's "no internal processes" rule.
    cg = make_cgroup(mount, f"headroom-test-{os.getpid()}")
    try:
        (cg / "memory.max").write_text(str(GiB))
        r = run_probe_in(cg, 100)
        assert (r["limit_source"], r["cgroup_version"]) == ("cgroup", 2)
        assert r["total_bytes"] == GiB
        assert r["cgroup_used_bytes"] >= 100 * MiB
        assert r["available_bytes"] <= GiB - 100 * MiB
    finally:
        remove_cgroup(cg)
