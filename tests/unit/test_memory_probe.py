"""The memory probe against files captured from real machines (and written in the exact
format of real kernels), and against this machine's own /proc and cgroups."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any, Dict, Optional

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trayapp.probes import memory as memory_mod
from trayapp.probes.memory import (
    MemoryProbe,
    PsutilMemoryProbe,
    make_memory_probe,
    parse_meminfo,
    parse_psi,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "memory"
KiB = 1024
GiB = 1024**3


def probe_for(case: str, pid: str = "self", root: Path = FIXTURES) -> MemoryProbe:
    return MemoryProbe(proc_root=str(root / case / "proc"), cgroup_root=str(root / case / "cgroup"),
                       pid=pid, clock=lambda: 1234.5)


def copy_case(case: str, tmp_path: Path) -> Path:
    shutil.copytree(FIXTURES / case, tmp_path / case)
    return tmp_path


# Expected values worked out by hand from the fixture files (kB lines times 1024; cgroup
# usage is memory.usage_in_bytes / memory.current less (total_)inactive_file at the limited
# level).
CASES: Dict[str, Dict[str, Any]] = {
    "v1_unlimited": dict(
        limit_source="host", cgroup_version=1, cgroup_limit_bytes=None, cgroup_used_bytes=None,
        total_bytes=24683652 * KiB, available_bytes=24329416 * KiB,
        host_total_bytes=24683652 * KiB, swap_total_bytes=0, swap_used_bytes=0,
        psi_some_avg10=0.0, psi_full_avg10=0.0, psi_full_total_us=0),
    "v1_limited": dict(
        limit_source="cgroup", cgroup_version=1, cgroup_limit_bytes=2 * GiB,
        cgroup_used_bytes=275775488 - 77824, total_bytes=2 * GiB,
        available_bytes=2 * GiB - (275775488 - 77824), host_available_bytes=24069216 * KiB),
    "v1_nested": dict(
        # The limit sits on the parent; the parent's usage counts.
        limit_source="cgroup", cgroup_version=1, cgroup_limit_bytes=2 * GiB,
        cgroup_used_bytes=410923008 - 118784, available_bytes=2 * GiB - (410923008 - 118784)),
    "v2_desktop": dict(
        limit_source="cgroup", cgroup_version=2, cgroup_limit_bytes=8 * GiB,
        cgroup_used_bytes=6871240704 - 402653184, total_bytes=8 * GiB,
        available_bytes=8 * GiB - (6871240704 - 402653184),
        host_total_bytes=32587652 * KiB, host_available_bytes=12981340 * KiB,
        swap_total_bytes=2097148 * KiB, swap_used_bytes=(2097148 - 1834996) * KiB,
        psi_some_avg10=1.35, psi_full_avg10=0.42, psi_full_total_us=6123456),
    "v2_desktop/3141": dict(
        limit_source="host", cgroup_version=2, cgroup_limit_bytes=None,
        total_bytes=32587652 * KiB, available_bytes=12981340 * KiB,
        used_bytes=(32587652 - 12981340) * KiB),
    "v2_desktop/5151": dict(
        # No limit on the scope; the 12 GiB slice's usage (with the sibling job) is what counts.
        limit_source="cgroup", cgroup_version=2, cgroup_limit_bytes=12 * GiB,
        cgroup_used_bytes=9663676416 - 1073741824, total_bytes=12 * GiB,
        available_bytes=12 * GiB - (9663676416 - 1073741824)),
    "v2_container": dict(
        limit_source="cgroup", cgroup_version=2, cgroup_limit_bytes=4 * GiB,
        cgroup_used_bytes=1288490188 - 268435456, total_bytes=4 * GiB,
        swap_total_bytes=0, swap_used_bytes=0, psi_full_total_us=1203344),
    "v1_container": dict(
        limit_source="cgroup", cgroup_version=1, cgroup_limit_bytes=2 * GiB,
        cgroup_used_bytes=1342177280 - 268435456, available_bytes=GiB,
        swap_total_bytes=2097148 * KiB, swap_used_bytes=0),
    "v1_pod": dict(
        limit_source="cgroup", cgroup_version=1, cgroup_limit_bytes=3 * GiB,
        cgroup_used_bytes=GiB, available_bytes=2 * GiB, total_bytes=3 * GiB),
    "psi_missing": dict(
        limit_source="host", cgroup_version=1, cgroup_limit_bytes=None,
        psi_some_avg10=None, psi_full_avg10=None, psi_full_total_us=None,
        total_bytes=16211556 * KiB, available_bytes=13102464 * KiB,
        swap_total_bytes=8388604 * KiB, swap_used_bytes=(8388604 - 8126460) * KiB),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fixture_readings(case: str) -> None:
    folder, _, pid = case.partition("/")
    reading = probe_for(folder, pid or "self").read()
    got = reading.to_json()
    for key, want in CASES[case].items():
        assert got[key] == want, key
    assert reading.time == 1234.5
    assert reading.used_bytes == reading.total_bytes - reading.available_bytes
    if reading.limit_source == "cgroup":
        assert reading.total_bytes == reading.cgroup_limit_bytes
        assert reading.available_bytes < (reading.host_available_bytes or 0)
    else:
        assert reading.total_bytes == reading.host_total_bytes
        assert reading.available_bytes == reading.host_available_bytes


def test_container_path_missing_under_the_mount_falls_back_to_the_root() -> None:
    probe = probe_for("v1_container")
    assert probe.cgroup is not None
    assert probe.cgroup.leaf == str(FIXTURES / "v1_container" / "cgroup" / "memory")


def test_container_path_tail_found_under_the_mount(tmp_path: Path) -> None:
    # The host path is /docker/<id>/worker; the container's mount root is /docker/<id>,
    # so the process's cgroup is "worker" under the mount.
    root = copy_case("v2_container", tmp_path)
    cg = root / "v2_container" / "cgroup"
    worker = cg / "worker"
    worker.mkdir()
    for name in ("memory.current", "memory.stat"):
        shutil.copy(cg / name, worker / name)
    (worker / "memory.max").write_text("1073741824\n")
    (root / "v2_container" / "proc" / "self" / "cgroup").write_text("0::/docker/3f9c2b7d/worker\n")
    probe = probe_for("v2_container", root=root)
    assert probe.cgroup is not None and probe.cgroup.leaf == str(worker)
    r = probe.read()
    assert (r.cgroup_limit_bytes, r.limit_source) == (GiB, "cgroup")
    assert r.cgroup_used_bytes == 1288490188 - 268435456


def test_hybrid_host_with_memory_on_v2(tmp_path: Path) -> None:
    # v1 hierarchies without the memory controller, v2 at "unified" with it.
    case = tmp_path / "hybrid"
    shutil.copytree(FIXTURES / "v2_desktop" / "proc", case / "proc")
    shutil.copytree(FIXTURES / "v2_desktop" / "cgroup", case / "cgroup" / "unified")
    for name in ("cpu,cpuacct", "pids", "devices"):
        (case / "cgroup" / name).mkdir()
    scope = "/user.slice/user-1000.slice/user@1000.service/app.slice/app-headroom-train.scope"
    (case / "proc" / "self" / "cgroup").write_text(
        f"4:pids:{scope}\n3:devices:/user.slice\n2:cpu,cpuacct:/user.slice\n"
        f"1:name=systemd:{scope}\n0::{scope}\n")
    r = probe_for("hybrid", root=tmp_path).read()
    assert (r.cgroup_version, r.cgroup_limit_bytes, r.limit_source) == (2, 8 * GiB, "cgroup")


def test_no_cgroup_filesystem_is_host_only(tmp_path: Path) -> None:
    probe = MemoryProbe(proc_root=str(FIXTURES / "v1_limited" / "proc"),
                        cgroup_root=str(tmp_path / "absent"))
    r = probe.read()
    assert probe.cgroup is None
    assert (r.limit_source, r.cgroup_version, r.cgroup_limit_bytes) == ("host", None, None)
    assert r.available_bytes == 24069216 * KiB


def test_v2_root_without_memory_controller_is_host_only(tmp_path: Path) -> None:
    root = copy_case("v2_desktop", tmp_path)
    (root / "v2_desktop" / "cgroup" / "cgroup.controllers").write_text("cpuset cpu io pids\n")
    r = probe_for("v2_desktop", root=root).read()
    assert (r.limit_source, r.cgroup_version) == ("host", None)


@pytest.mark.parametrize("case,limit_file,value", [
    ("v1_limited", "ci/runner-1/limited/memory.limit_in_bytes", str(64 * GiB)),
    ("v1_limited", "ci/runner-1/limited/memory.limit_in_bytes", "9223372036854771712"),
    ("v2_desktop", "user.slice/user-1000.slice/user@1000.service/app.slice/"
                   "app-headroom-train.scope/memory.max", str(64 * GiB)),
    ("v2_desktop", "user.slice/user-1000.slice/user@1000.service/app.slice/"
                   "app-headroom-train.scope/memory.max", "max"),
])
def test_limit_at_or_above_host_ram_is_no_limit(tmp_path: Path, case: str, limit_file: str,
                                                value: str) -> None:
    root = copy_case(case, tmp_path)
    cg = root / case / "cgroup"
    target = cg / "memory" / limit_file if case.startswith("v1") else cg / limit_file
    target.write_text(value + "\n")
    stat = target.parent / "memory.stat"
    if case.startswith("v1"):  # the kernel shows the new limit there too
        text = stat.read_text().replace("hierarchical_memory_limit 2147483648",
                                        f"hierarchical_memory_limit {value}")
        stat.write_text(text)
    r = probe_for(case, root=root).read()
    assert (r.limit_source, r.cgroup_limit_bytes) == ("host", None)
    assert r.total_bytes == r.host_total_bytes


def test_limit_set_while_running_is_seen_on_the_next_read(tmp_path: Path) -> None:
    root = copy_case("v2_desktop", tmp_path)
    probe = probe_for("v2_desktop", "3141", root=root)
    assert probe.read().limit_source == "host"
    scope = (root / "v2_desktop" / "cgroup" / "user.slice" / "user-1000.slice" /
             "user@1000.service" / "app.slice" / "app-org.gnome.Terminal.slice" /
             "vte-spawn-5f0e7a8c-2d1b-4e6f-9a3c-81d2b7e4c019.scope")
    (scope / "memory.max").write_text(f"{GiB}\n")
    r = probe.read()
    assert (r.limit_source, r.cgroup_limit_bytes) == ("cgroup", GiB)


def test_cgroup_removed_makes_the_probe_look_again(tmp_path: Path) -> None:
    root = copy_case("v1_limited", tmp_path)
    probe = probe_for("v1_limited", root=root)
    assert probe.read().limit_source == "cgroup"
    # The process is moved to its parent and the limited cgroup removed.
    shutil.rmtree(root / "v1_limited" / "cgroup" / "memory" / "ci" / "runner-1" / "limited")
    cgroup_file = root / "v1_limited" / "proc" / "self" / "cgroup"
    cgroup_file.write_text(cgroup_file.read_text().replace("/ci/runner-1/limited", "/ci/runner-1"))
    r = probe.read()
    assert (r.limit_source, r.cgroup_version, r.cgroup_limit_bytes) == ("host", 1, None)
    assert probe.cgroup is not None
    assert probe.cgroup.leaf.endswith(os.path.join("memory", "ci", "runner-1"))


def test_unreadable_cgroup_gives_a_host_reading(tmp_path: Path) -> None:
    root = copy_case("v2_container", tmp_path)
    probe = probe_for("v2_container", root=root)
    (root / "v2_container" / "cgroup" / "memory.current").unlink()
    r = probe.read()
    assert (r.limit_source, r.cgroup_limit_bytes) == ("host", None)
    assert r.available_bytes == 55907312 * KiB


def test_psi_read_error_gives_none_and_keeps_trying(tmp_path: Path) -> None:
    root = copy_case("v2_container", tmp_path)
    psi = root / "v2_container" / "proc" / "pressure" / "memory"
    psi.unlink()
    psi.mkdir()  # reading it fails like a kernel booted with psi=0 (EOPNOTSUPP)
    probe = probe_for("v2_container", root=root)
    r = probe.read()
    assert (r.psi_some_avg10, r.psi_full_avg10, r.psi_full_total_us) == (None, None, None)
    psi.rmdir()
    psi.write_text("some avg10=2.50 avg60=1.00 avg300=0.20 total=900\n"
                   "full avg10=1.25 avg60=0.50 avg300=0.10 total=450\n")
    r = probe.read()
    assert (r.psi_some_avg10, r.psi_full_avg10, r.psi_full_total_us) == (2.5, 1.25, 450)


def test_meminfo_unreadable_raises(tmp_path: Path) -> None:
    probe = MemoryProbe(proc_root=str(tmp_path), cgroup_root=str(tmp_path))
    with pytest.raises(OSError):
        probe.read()


def test_files_lists_what_a_tick_reads() -> None:
    limited = probe_for("v2_desktop").files()
    assert limited[0].endswith("meminfo") and limited[1].endswith(os.path.join("pressure",
                                                                                "memory"))
    assert sum(p.endswith("memory.max") for p in limited) == 5  # the scope and 4 ancestors
    assert sum(p.endswith("memory.current") for p in limited) == 1
    unlimited = probe_for("v2_desktop", "3141").files()
    assert not any(p.endswith(("memory.current", "memory.stat")) for p in unlimited)
    assert not any("pressure" in p for p in probe_for("psi_missing").files())
    assert all(os.path.isfile(p) for p in limited + unlimited)


# --- parsers -------------------------------------------------------------------------------


def test_meminfo_without_memavailable_is_estimated() -> None:
    data = (b"MemTotal:        8046284 kB\nMemFree:         1203344 kB\n"
            b"Buffers:          208812 kB\nCached:          3002112 kB\n"
            b"SwapCached:            0 kB\n")
    total, available, swap_total, swap_free = parse_meminfo(data)
    assert total == 8046284 * KiB
    assert available == (1203344 + 208812 + 3002112) * KiB
    assert (swap_total, swap_free) == (0, 0)


def test_meminfo_without_memtotal_is_an_error() -> None:
    with pytest.raises(ValueError):
        parse_meminfo(b"MemFree: 10 kB\n")


def _kernel_line(key: str, kb: int) -> str:
    return f"{(key + ':').ljust(16)}{kb:>8} kB\n"


@settings(max_examples=200, deadline=None)
@given(total=st.integers(1, 2**40), available=st.integers(0, 2**40),
       swap_total=st.integers(0, 2**36), swap_used=st.integers(0, 2**36),
       before=st.lists(st.sampled_from(["Active", "Inactive", "Zswap", "Mlocked"]), max_size=3))
def test_meminfo_parse_property(total: int, available: int, swap_total: int, swap_used: int,
                                before: list) -> None:
    swap_free = max(0, swap_total - swap_used)
    text = _kernel_line("MemTotal", total) + _kernel_line("MemFree", 7)
    text += "".join(_kernel_line(k, 99) for k in before)
    text += _kernel_line("MemAvailable", available)
    text += _kernel_line("SwapTotal", swap_total) + _kernel_line("SwapFree", swap_free)
    text += "HugePages_Total:       0\n"
    assert parse_meminfo(text.encode()) == (total * KiB, available * KiB, swap_total * KiB,
                                            swap_free * KiB)


def test_psi_some_only_gives_no_full() -> None:
    assert parse_psi(b"some avg10=3.21 avg60=1.00 avg300=0.50 total=12345\n") == (
        3.21, None, None)


# --- this machine ----------------------------------------------------------------------------


def _memory_line_in_proc_self_cgroup() -> Optional[str]:
    with open("/proc/self/cgroup") as f:
        for line in f:
            hid, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                return path
    return None


@pytest.mark.alone
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_this_machine_matches_psutil() -> None:
    probe = MemoryProbe()
    r = probe.read()
    vm = psutil.virtual_memory()
    assert r.host_total_bytes == vm.total
    assert r.host_available_bytes is not None
    assert abs(r.host_available_bytes - vm.available) < 256 * 1024**2
    assert r.swap_total_bytes == psutil.swap_memory().total
    assert r.used_bytes == r.total_bytes - r.available_bytes
    if r.limit_source == "cgroup":
        assert r.total_bytes == r.cgroup_limit_bytes
    else:
        assert r.total_bytes == vm.total
    if _memory_line_in_proc_self_cgroup() is not None and os.path.isdir("/sys/fs/cgroup/memory"):
        assert r.cgroup_version == 1
    if os.path.exists("/proc/pressure/memory"):
        assert r.psi_some_avg10 is not None and r.psi_full_total_us is not None


@pytest.mark.alone
def test_psutil_probe_matches_psutil() -> None:
    r = PsutilMemoryProbe(clock=lambda: 99.0).read()
    vm = psutil.virtual_memory()
    assert r.time == 99.0
    assert r.total_bytes == vm.total
    assert abs(r.available_bytes - vm.available) < 256 * 1024**2
    assert r.used_bytes == r.total_bytes - r.available_bytes
    assert r.swap_total_bytes == psutil.swap_memory().total
    assert (r.psi_some_avg10, r.psi_full_avg10, r.limit_source) == (None, None, "host")


def test_factory_picks_the_probe_for_the_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    if sys.platform.startswith("linux"):
        assert isinstance(make_memory_probe(), MemoryProbe)
        p = make_memory_probe(proc_root=str(FIXTURES / "psi_missing" / "proc"),
                              cgroup_root=str(FIXTURES / "psi_missing" / "cgroup"))
        assert p.read().psi_some_avg10 is None
    monkeypatch.setattr(memory_mod.sys, "platform", "win32")
    p = make_memory_probe(clock=lambda: 7.0)
    assert isinstance(p, PsutilMemoryProbe)
    assert p.read().time == 7.0
