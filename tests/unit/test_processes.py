"""Process and process-tree memory with real child processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Iterator, List

import psutil
import pytest

from trayapp.probes.names import person_name
from trayapp.probes.processes import (
    SAME_PROCESS_TOLERANCE_S,
    ProcessSampler,
    pids_rss,
    process_name,
    same_process,
    same_start,
    tree_memory,
    tree_pids,
    tree_vram,
)
from trayapp.readings import GpuProcess, GpuReading

MiB = 1024**2

# Holds SIZE MiB of touched memory until its stdin closes.
HOG = textwrap.dedent(
    """
    import sys
    block = b"\\x01" * (int(sys.argv[1]) * 1024 * 1024)
    print("ready", flush=True)
    sys.stdin.read()
    """
)

# Starts two hogs of SIZE MiB, prints their pids, and stops them when its own stdin closes.
PARENT = textwrap.dedent(
    """
    import subprocess, sys
    hog, size = sys.argv[1], sys.argv[2]
    kids = [subprocess.Popen([sys.executable, "-c", hog, size], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True) for _ in range(2)]
    for k in kids:
        assert k.stdout.readline().strip() == "ready"
    print(" ".join(str(k.pid) for k in kids), flush=True)
    sys.stdin.read()
    for k in kids:
        k.stdin.close()
        k.wait(30)
    """
)


def start(args: List[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None and not pipe.closed:
            pipe.close()


@pytest.fixture
def hog() -> Iterator[subprocess.Popen]:
    proc = start([HOG, "200"])
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        stop(proc)


@pytest.fixture
def family() -> Iterator[tuple]:
    proc = start([PARENT, HOG, "50"])
    kids: List[int] = []
    try:
        assert proc.stdout is not None
        kids = [int(p) for p in proc.stdout.readline().split()]
        assert len(kids) == 2
        yield proc, kids
    finally:
        stop(proc)
        for pid in kids:  # if the parent could not stop them
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass


def test_tree_memory_of_a_process_holding_200_mib(hog: subprocess.Popen) -> None:
    m = tree_memory(hog.pid)
    assert m is not None
    assert m.pid == hog.pid
    assert m.name == psutil.Process(hog.pid).name()
    assert m.rss_bytes >= 200 * MiB
    assert m.tree_rss_bytes == m.rss_bytes
    assert m.tree_pids == (hog.pid,)
    assert m.vram_bytes is None  # no GPU readings given


def test_tree_of_a_parent_with_two_children(family: tuple) -> None:
    parent, kids = family
    assert tree_pids(parent.pid)[0] == parent.pid
    assert sorted(tree_pids(parent.pid)[1:]) == sorted(kids)
    m = tree_memory(parent.pid)
    assert m is not None
    assert set(m.tree_pids) == {parent.pid, *kids}
    kid_rss = [psutil.Process(k).memory_info().rss for k in kids]
    assert all(r >= 50 * MiB for r in kid_rss)
    assert m.tree_rss_bytes >= m.rss_bytes + 100 * MiB
    assert m.rss_bytes < 50 * MiB  # the parent itself holds little


def test_vram_is_mapped_onto_the_tree(family: tuple) -> None:
    parent, (a, b) = family
    gpus = (
        GpuReading(0, "GPU 0", None, 8 * 1024 * MiB, 2048 * MiB, 6144 * MiB, processes=(
            GpuProcess(a, "python3", 1024 * MiB), GpuProcess(1, "Xorg", 300 * MiB, "graphics"))),
        GpuReading(1, "GPU 1", None, 8 * 1024 * MiB, 600 * MiB, 7592 * MiB, processes=(
            GpuProcess(b, "python3", 512 * MiB),)),
    )
    m = tree_memory(parent.pid, gpus)
    assert m is not None and m.vram_bytes == 1536 * MiB
    assert tree_memory(a, gpus).vram_bytes == 1024 * MiB  # type: ignore[union-attr]


def test_tree_vram_rules() -> None:
    known = GpuReading(0, "g", None, None, None, None, processes=(GpuProcess(10, "p", 5 * MiB),))
    unknown = GpuReading(0, "g", None, None, None, None, processes=(GpuProcess(10, "p", None),))
    assert tree_vram([10, 11], [known]) == 5 * MiB
    assert tree_vram([12], [known]) == 0  # on a machine with GPUs, not on any of them
    assert tree_vram([10], [unknown]) is None  # WDDM / MIG: unknown is not 0
    assert tree_vram([10], []) is None  # no GPU readings at all


def test_gone_process(hog: subprocess.Popen) -> None:
    pid = hog.pid
    stop(hog)
    assert tree_memory(pid) is None
    assert tree_pids(pid) == []
    assert process_name(pid) == ""


def test_process_name_of_this_process() -> None:
    me = psutil.Process()
    assert process_name(os.getpid()) == person_name(me.name(), me.cmdline())


# Grows by SIZE MiB (touched) each time a line comes on its stdin, and says so.
GROWER = textwrap.dedent(
    """
    import sys
    blocks = []
    print("ready", flush=True)
    for line in sys.stdin:
        blocks.append(b"\\x01" * (int(line) * 1024 * 1024))
        print("grown", flush=True)
    """
)


def test_the_sampler_names_the_largest_first(hog: subprocess.Popen) -> None:
    top = ProcessSampler().sample(5)
    hog_rss = psutil.Process(hog.pid).memory_info().rss
    assert 1 <= len(top) <= 5
    assert [r.rss_bytes for r in top] == sorted((r.rss_bytes for r in top), reverse=True)
    assert all(r.rate_bytes_per_s is None for r in top)  # nothing to compare with yet
    by_pid = {r.pid: r for r in top}
    if hog.pid in by_pid:
        row = by_pid[hog.pid]
        assert row.name == psutil.Process(hog.pid).name() and row.rss_bytes >= 200 * MiB
        assert same_start(row.create_time, psutil.Process(hog.pid).create_time())
    else:  # other processes on this machine hold more: all five must
        assert len(top) == 5 and all(r.rss_bytes >= hog_rss - 16 * MiB for r in top)
    assert ProcessSampler().sample(0) == []


def test_the_sampler_gives_the_growth_of_a_process_it_saw_before() -> None:
    proc = start([GROWER])
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        now = [1000.0]
        sampler = ProcessSampler(clock=lambda: now[0])
        mine = psutil.Process(proc.pid).name()
        also = (lambda name: name == mine)  # the grower, and any other process of that name
        (first,) = [r for r in sampler.sample(0, also) if r.pid == proc.pid]
        assert first.rate_bytes_per_s is None
        proc.stdin.write("64\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "grown"
        now[0] += 2.0
        (second,) = [r for r in sampler.sample(0, also) if r.pid == proc.pid]
        grown = second.rss_bytes - first.rss_bytes
        assert grown >= 60 * MiB
        assert second.rate_bytes_per_s == pytest.approx(grown / 2.0)
        # Not asked for this time, but remembered: it comes back with its growth over the
        # rate window (3 s: from the first sample on).
        assert [r for r in sampler.sample(0) if r.pid == proc.pid] == []
        now[0] += 1.0
        (third,) = [r for r in sampler.sample(0, also) if r.pid == proc.pid]
        assert third.rate_bytes_per_s == pytest.approx((third.rss_bytes - first.rss_bytes) / 3.0)
        # Past the look-back (4 windows) nothing is left to measure from.
        now[0] += 13.0
        (fourth,) = [r for r in sampler.sample(0, also) if r.pid == proc.pid]
        assert fourth.rate_bytes_per_s is None
    finally:
        stop(proc)


def test_same_process_is_the_one_that_started_then(hog: subprocess.Popen) -> None:
    created = psutil.Process(hog.pid).create_time()
    found = same_process(hog.pid, created)
    assert found is not None and found.pid == hog.pid
    assert same_process(hog.pid, created + SAME_PROCESS_TOLERANCE_S / 2) is not None
    assert same_process(hog.pid, created + 10 * SAME_PROCESS_TOLERANCE_S) is None  # pid reused
    assert same_process(hog.pid, None) is not None
    stop(hog)
    assert same_process(hog.pid, created) is None


def test_pids_rss_sums_the_processes_still_there(family: tuple) -> None:
    _, kids = family
    each = [psutil.Process(pid).memory_info().rss for pid in kids]
    total = pids_rss(kids)
    assert total is not None and abs(total - sum(each)) < 8 * MiB
    assert pids_rss(kids + [2**22 + 12345]) == pytest.approx(total, abs=8 * MiB)
    assert pids_rss([2**22 + 12345]) is None and pids_rss([]) is None
