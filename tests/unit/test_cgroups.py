"""The kernel brake's pure parts, on folder trees made to look like a cgroupfs: what a machine
offers, the files read as numbers, the limit a job gets, a job's cgroup made, read, written and
removed, and how a run the brake ended ends."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, Dict, Optional

import pytest

from trayapp.jobs import cgroups
from trayapp.jobs.brake_ends import (
    OOM_KILL,
    STALL,
    brake_accumulation,
    brake_end,
    why_not_smaller,
)
from trayapp.jobs.cgroups import (
    NONE,
    V1,
    CgroupError,
    Offer,
    brake_limit,
    charged_elsewhere,
    detect,
    kernel_limit,
    own_cgroups,
    parse_keyed,
    reading,
    tag_of,
    worth_writing,
)
from trayapp.jobs.cgroups_v1 import JobCgroup
from trayapp.jobs.record import JobRecord
from trayapp.vocab import EventKind as E
from trayapp.vocab import JobState as S

MiB = 1024 * 1024
# /proc/self/cgroup as read on a development machine (cgroup v1, hybrid).
V1_PROC = """9:name=systemd:/
8:pids:/
6:freezer:/
4:memory:/process_api/720a67dc
1:cpu:/
0::/
"""
V2_PROC = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/tray.scope\n"
STAT = """cache 4096
rss 1048576
total_cache 8192
total_rss 2097152
total_inactive_file 4096
"""
OOM = "oom_kill_disable 1\nunder_oom 1\noom_kill 2\n"


def fake_v1(tmp: Path, freezer: bool = True, oom_control: bool = True) -> Dict[str, Path]:
    """A cgroupfs root with a v1 memory hierarchy (the engine in /process_api/720a67dc) and a
    freezer; returns the root and /proc/self/cgroup."""
    root = tmp / "cgroup"
    mem = root / "memory"
    (mem / "process_api" / "720a67dc").mkdir(parents=True)
    (mem / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    if oom_control:
        (mem / "process_api" / "720a67dc" / "memory.oom_control").write_text(OOM)
    if freezer:
        (root / "freezer").mkdir()
        (root / "freezer" / "cgroup.procs").write_text("")
    proc = tmp / "proc-self-cgroup"
    proc.write_text(V1_PROC)
    return {"root": root, "proc": proc, "parent": mem / "process_api" / "720a67dc"}


# -- what the machine offers ---------------------------------------------------------------------


def test_proc_cgroup_lines_are_read_per_controller() -> None:
    own = own_cgroups(V1_PROC + "garbage\n3:cpu,cpuacct:/x\n")
    assert own["memory"] == "/process_api/720a67dc"
    assert own["freezer"] == "/" and own[""] == "/" and own["cpuacct"] == "/x"


def test_a_writable_v1_hierarchy_with_a_freezer_is_a_kernel_brake(tmp_path: Path) -> None:
    t = fake_v1(tmp_path)
    offer = detect(str(t["root"]), str(t["proc"]))
    assert offer.kind == V1 and offer.brakes
    assert offer.memory_parent == str(t["parent"])
    assert offer.freezer_parent == str(t["root"] / "freezer")
    assert offer.words == "kernel brake (cgroup v1)" and offer.tag == "brake-v1"
    assert [p.name for p in t["parent"].iterdir()] == ["memory.oom_control"]  # probe removed
    assert offer.to_json()["freezer"] is True


def test_without_a_freezer_jobs_are_braked_and_paused_by_signal(tmp_path: Path) -> None:
    t = fake_v1(tmp_path, freezer=False)
    offer = detect(str(t["root"]), str(t["proc"]))
    assert offer.brakes and offer.freezer_parent is None


def test_no_memory_controller_files_is_the_guard_only(tmp_path: Path) -> None:
    t = fake_v1(tmp_path, oom_control=False)
    offer = detect(str(t["root"]), str(t["proc"]))
    assert not offer.brakes
    assert offer.words.startswith("none: the guard only (no memory controller files in ")


def test_a_read_only_cgroupfs_is_the_guard_only(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    t = fake_v1(tmp_path)

    def refuse(path: Any, mode: int = 0o777) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "mkdir", refuse)
    offer = detect(str(t["root"]), str(t["proc"]))
    assert offer.kind == NONE
    assert "cannot make a cgroup in" in offer.why and "read-only file system" in offer.why


def test_v2_without_its_hierarchy_or_a_user_manager_is_the_guard_only(tmp_path: Path) -> None:
    # (tests/unit/test_cgroups_v2.py has the v2 brake, found, and each thing it may lack.)
    proc = tmp_path / "cgroup"
    proc.write_text(V2_PROC)
    offer = detect(str(tmp_path / "none"), str(proc), environ={})
    assert offer.kind == NONE and "is not a cgroup v2 hierarchy" in offer.why
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "cgroup.controllers").write_text("memory\n")
    proc.write_text("0::/init.scope\n")
    offer = detect(str(tmp_path / "v2"), str(proc), environ={"XDG_RUNTIME_DIR": str(tmp_path)})
    assert "without a running systemd user manager" in offer.why


def test_the_setting_turns_the_brake_off(tmp_path: Path) -> None:
    t = fake_v1(tmp_path)
    offer = detect(str(t["root"]), str(t["proc"]), enabled=False)
    assert offer.words == "none: the guard only (the kernel brake is off (guard.kernel_brake))"
    assert detect(str(t["root"]), str(tmp_path / "missing")).why == "no cgroups on this system"


def test_tags_of_protections() -> None:
    assert tag_of("kernel brake (cgroup v1)") == "brake-v1"
    assert tag_of("kernel brake (cgroup v2, systemd)") == "brake-v2"
    assert tag_of("none: the guard only (its cgroup is gone)") == "guard"
    assert tag_of(None) == ""


# -- readings ------------------------------------------------------------------------------------


def test_a_reading_from_the_five_files() -> None:
    r = reading("10485760\n", "9223372036854771712\n", STAT, OOM, "7\n")
    assert r.usage == 10 * MiB and r.limit is None
    assert (r.anon, r.file, r.inactive_file) == (2097152, 8192, 4096)
    assert r.under_oom and r.oom_kill == 2 and r.failcnt == 7
    assert r.working_set == 10 * MiB - 4096
    assert r.to_json()["working_set_bytes"] == r.working_set
    assert r.held == r.usage  # held at its limit (none here): its whole use
    assert reading("8192", "16384", STAT, OOM, "0").held == 16384  # at its limit: the limit
    assert reading("8192", "1", STAT, "under_oom 0", "0").held == 4096
    with pytest.raises(ValueError):
        reading("x", "1", "", "", "0")
    assert parse_keyed("a 1\nb two\nc\nd 4 5\n") == {"a": 1}


# -- the limit -----------------------------------------------------------------------------------

G = 1024 * MiB


@pytest.mark.parametrize("usage, budget, available, reserve, current, expected, why", [
    (0, 1350 * MiB, 20 * G, G, None, 1350 * MiB, "the budget, on a machine with room"),
    (100 * MiB, None, 2 * G, G, None, 1124 * MiB, "no budget: use + available - reserve"),
    (500 * MiB, 1350 * MiB, 1 * G, 600 * MiB, 1350 * MiB, 924 * MiB,
     "the machine gives less than the budget: the limit comes down"),
    (1350 * MiB, 1350 * MiB, 10 * G, G, 1350 * MiB, 1350 * MiB,
     "held at its budget: the limit does not creep up"),
    (1200 * MiB, 1000 * MiB, 10 * G, G, None, 1216 * MiB,
     "a budget below its use: a margin above the use"),
    (1216 * MiB, 1000 * MiB, 10 * G, G, 1216 * MiB, 1216 * MiB,
     "...and it stays there, not a margin more a tick"),
    (800 * MiB, 2 * G, 100 * MiB, 500 * MiB, 2 * G, 816 * MiB,
     "a machine past its reserve: a margin above the use, not below it"),
    (800 * MiB, 2 * G, 100 * MiB, 500 * MiB, 808 * MiB, 808 * MiB,
     "...never above the limit it already has"),
    (800 * MiB, 2 * G, 510 * MiB, 500 * MiB, 800 * MiB, 810 * MiB,
     "memory coming back raises it"),
])
def test_the_brakes_limit(usage: int, budget: Optional[int], available: int, reserve: int,
                          current: Optional[int], expected: int, why: str) -> None:
    assert brake_limit(usage, budget, available, reserve, current) == expected, why
    assert brake_limit(usage, budget, available, reserve, current) >= min(usage, expected)


def test_what_a_kernel_holds_outside_its_cgroup() -> None:
    assert charged_elsewhere(100 * MiB, 400 * MiB) == 300 * MiB
    assert charged_elsewhere(500 * MiB, 400 * MiB) == 0  # its cgroup holds cache too
    assert charged_elsewhere(100 * MiB, None) == 0  # its tree's RSS not known


G = 1024 * MiB


@pytest.mark.parametrize("usage,outside,budget,available,reserve,current,expected,why", [
    (0, 0, 1 * G, 8 * G, 0, None, 1 * G, "nothing elsewhere: the script job's limit"),
    (0, 300 * MiB, 1 * G, 8 * G, 0, None, 1 * G - 300 * MiB,
     "just adopted: its budget less what it holds where it was"),
    (200 * MiB, 300 * MiB, 1 * G, 8 * G, 0, 724 * MiB, 1 * G - 300 * MiB,
     "growing in its cgroup: the same total"),
    (100 * MiB, 300 * MiB, 1 * G, 500 * MiB, 100 * MiB, None, 500 * MiB,
     "the machine's room: all it holds + available - reserve, less what is elsewhere"),
    (100 * MiB, 900 * MiB, 512 * MiB, 8 * G, 0, None, 100 * MiB + 16 * MiB,
     "a budget below what it holds elsewhere: a margin above its cgroup's use, never below"),
    (400 * MiB, 900 * MiB, 512 * MiB, 8 * G, 0, 400 * MiB, 400 * MiB,
     "held at its limit stays held: never creeping up a margin a tick"),
])
def test_a_kernels_limit_counts_what_it_holds_elsewhere(
        usage: int, outside: int, budget: int, available: int, reserve: int,
        current: Optional[int], expected: int, why: str) -> None:
    limit = kernel_limit(usage, outside, budget, available, reserve, current)
    assert limit == expected, why
    assert limit >= usage, "never a limit below what its cgroup holds"
    if budget >= usage + outside + 16 * MiB:
        assert limit + outside <= budget, "never more than its budget in all"


def test_a_limit_is_written_when_it_comes_down_or_moves_a_step() -> None:
    assert worth_writing(5, None)
    assert worth_writing(100 * MiB - 1, 100 * MiB)
    assert not worth_writing(100 * MiB + 4096, 100 * MiB)
    assert worth_writing(101 * MiB, 100 * MiB)


# -- a job's cgroup on a fake tree ---------------------------------------------------------------


def made(tmp: Path) -> JobCgroup:
    t = fake_v1(tmp)
    offer = detect(str(t["root"]), str(t["proc"]))
    group = JobCgroup.make(offer, "abcd1234")
    mem = Path(group.memory)
    for name, text in (("memory.usage_in_bytes", "4096"),
                       ("memory.limit_in_bytes", "9223372036854771712"),
                       ("memory.stat", STAT), ("memory.failcnt", "0"),
                       ("memory.max_usage_in_bytes", "8192"), ("cgroup.procs", "")):
        (mem / name).write_text(text)
    return group


def test_a_job_cgroup_is_made_with_the_oom_killer_off(tmp_path: Path) -> None:
    group = made(tmp_path)
    mem = Path(group.memory)
    assert mem.name == "headroom-job-abcd1234"
    assert (mem / "memory.oom_control").read_text() == "1"
    assert group.freezer is not None and Path(group.freezer).name == mem.name
    group.set_limit(300 * MiB)
    assert (mem / "memory.limit_in_bytes").read_text() == str(300 * MiB)
    assert group.limit == 300 * MiB
    (mem / "memory.oom_control").write_text(OOM)
    r = group.read()
    assert r.usage == 4096 and r.under_oom and group.peak() == 8192
    assert group.add(4242)
    assert (mem / "cgroup.procs").read_text() == "4242"
    assert group.freeze() and Path(group.freezer, "freezer.state").read_text() == "FROZEN"
    assert group.thaw() and group.freezer_state() == "THAWED"


def test_a_cgroup_that_is_gone_says_so_in_one_line(tmp_path: Path) -> None:
    group = made(tmp_path)
    for p in Path(group.memory).iterdir():
        p.unlink()
    Path(group.memory).rmdir()
    with pytest.raises(CgroupError, match=r"^its cgroup .*headroom-job-abcd1234 is gone$"):
        group.read()
    with pytest.raises(CgroupError, match="is gone"):
        group.set_limit(1)


def test_a_write_refused_says_what_and_why(tmp_path: Path) -> None:
    group = made(tmp_path)
    os.remove(os.path.join(group.memory, "memory.limit_in_bytes"))
    os.mkdir(os.path.join(group.memory, "memory.limit_in_bytes"))  # a write now fails
    with pytest.raises(CgroupError, match="cannot write 5 to memory.limit_in_bytes of .*: is a"):
        group.set_limit(5)


def test_removing_a_cgroup_that_is_gone_is_fine(tmp_path: Path) -> None:
    group = JobCgroup(str(tmp_path / "gone"), str(tmp_path / "gone-too"))
    group.remove()


def test_no_cgroup_where_the_machine_offers_none() -> None:
    with pytest.raises(CgroupError, match="no cgroup for jobs here"):
        JobCgroup.make(Offer(NONE, "no cgroups on this system"), "x")
    assert cgroups.WORDS[NONE] == "none: the guard only"


# -- how a run the brake ended ends --------------------------------------------------------------


def rec(**kw: Any) -> JobRecord:
    base: Dict[str, Any] = dict(id="j1", name="wide", hooked=True, shrinkable=True, batch=4096,
                                checkpoint_dir="/tmp/ckpt", epoch=1, epochs=2, step=1, steps=2)
    base.update(kw)
    return JobRecord(**base)


def test_a_stalled_job_that_can_shrink_is_relaunched_from_its_checkpoint() -> None:
    end = brake_end(rec(), STALL, 1350 * MiB)
    assert (end.state, end.kind, end.accumulation, end.from_checkpoint) == \
        (S.PARKED, E.JOB_BRAKED, 2, True)
    assert end.message == ("job j1 (wide) stalled at its cgroup's limit of 1.3 GiB; relaunched "
                           "from its checkpoint at micro-batches of 2048 x 2 (the same training)")


def test_without_a_checkpoint_folder_it_starts_again_and_says_what_that_cost() -> None:
    end = brake_end(rec(checkpoint_dir=None, accumulation=2), OOM_KILL, 2 * G)
    assert end.accumulation == 4 and not end.from_checkpoint
    assert end.message == (
        "job j1 (wide) the kernel's OOM killer ended it at 2.0 GiB; relaunched from the "
        "beginning at micro-batches of 1024 x 4 (the same training); no checkpoint folder: the "
        "training so far is lost (it was at epoch 1 of 2, step 1 of 2)")


def test_below_min_batch_it_is_stopped_and_says_so() -> None:
    r = rec(spec={"min_batch": 4096})
    assert brake_accumulation(r) is None
    end = brake_end(r, STALL, G)
    assert end.state == S.STOPPED and end.accumulation is None
    assert "half its micro-batch of 4096 would be below --min-batch 4096" in end.reason
    assert end.message.endswith("continue it from its checkpoint with 'headroom resume j1'")


def test_an_oom_kill_of_a_job_that_cannot_shrink_is_a_failure_naming_the_cause() -> None:
    end = brake_end(rec(hooked=False), OOM_KILL, G)
    assert end.state == S.FAILED and end.kind == E.JOB_FAILED
    assert end.reason == ("the kernel's OOM killer ended it at 1.0 GiB; not relaunched: it does "
                          "not report to Headroom (no Keras fit hooked), so it cannot train "
                          "smaller")


def test_why_a_job_cannot_train_smaller() -> None:
    assert "Keras 2" in why_not_smaller(rec(shrinkable=False))
    assert "kernel" in why_not_smaller(rec(kind="kernel"))
    assert "does not split" in why_not_smaller(rec(batch=4095, accumulation=1,
                                                   spec={"min_batch": 1}))


def test_empty_job_cgroups_left_behind_are_swept(tmp_path: Path) -> None:
    t = fake_v1(tmp_path)
    offer = detect(str(t["root"]), str(t["proc"]))
    assert offer.memory_parent is not None
    empty, busy = Path(offer.memory_parent, "headroom-job-1"), Path(offer.memory_parent,
                                                                     "headroom-job-2")
    for folder, procs in ((empty, ""), (busy, "4242\n")):
        folder.mkdir()
        (folder / "cgroup.procs").write_text(procs)
    other = Path(offer.memory_parent, "someone-else")
    other.mkdir()
    # A fake folder holds its cgroup.procs file: rmdir fails as on a busy real cgroup.
    assert cgroups.sweep(offer) == []
    (empty / "cgroup.procs").unlink()
    (empty / "cgroup.procs").mkdir()  # read fails: left alone
    assert cgroups.sweep(offer) == [] and empty.exists() and busy.exists() and other.exists()


def test_the_dry_runs_line(tmp_path: Path) -> None:
    t = fake_v1(tmp_path)
    offer = detect(str(t["root"]), str(t["proc"]), probe=False)
    assert offer.brakes
    assert cgroups.plan_line(True, 1350, offer) == (
        "protection: kernel brake (cgroup v1): the kernel holds the job at the smaller of its "
        "budget (1.3 GiB) and what the machine can give it, with its OOM killer off; stalled "
        "there, a fit that can shrink is relaunched at half its micro-batch; a pause freezes its "
        "cgroup")
    assert "at what the machine can give it" in cgroups.plan_line(True, None, offer)
    off = detect(str(t["root"]), str(t["proc"]), enabled=False)
    assert cgroups.plan_line(False, 1350, off) == \
        "protection: none: the guard only (the kernel brake is off (guard.kernel_brake))"


def test_a_sigkill_waiting_for_a_frozen_task_is_seen(tmp_path: Path) -> None:
    for pid, pending in ((10, "0000000000000000"), (11, "0000000000000100")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "status").write_text(
            f"Name:\tpython\nSigPnd:\t0000000000000000\nShdPnd:\t{pending}\n")
    assert not cgroups.kill_pending([10, 12], proc=str(tmp_path))  # 12: gone
    assert cgroups.kill_pending([10, 11], proc=str(tmp_path))
