"""Process and process-tree memory with real child processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Iterator, List

import psutil
import pytest

from trayapp.probes.processes import (
    process_name,
    top_consumers,
    tree_memory,
    tree_pids,
    tree_vram,
)
from trayapp.probes.snapshot import GpuProcess, GpuReading

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
    assert process_name(os.getpid()) == psutil.Process().name()


def test_top_consumers(hog: subprocess.Popen) -> None:
    top = top_consumers(limit=5)
    hog_rss = psutil.Process(hog.pid).memory_info().rss
    assert 1 <= len(top) <= 5
    assert [r[2] for r in top] == sorted((r[2] for r in top), reverse=True)
    pids = [r[0] for r in top]
    if hog.pid in pids:
        (row,) = [r for r in top if r[0] == hog.pid]
        assert row[1] == psutil.Process(hog.pid).name() and row[2] >= 200 * MiB
    else:  # other processes on this machine hold more: all five must
        assert len(top) == 5 and all(r[2] >= hog_rss - 16 * MiB for r in top)
    assert top_consumers(limit=0) == []
