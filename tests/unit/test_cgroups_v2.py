"""cgroup v2's pure parts, on folder trees made to look like a unified cgroupfs with a systemd
user manager: what the machine offers (and each reason it offers nothing, in one line), the
files read, a job's scope asked for, read, limited, frozen, killed and let go of, and the job
manager placing a job in one (or guarding it without, when the manager refuses)."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from trayapp.jobs import cgroups, cgroups_v2, scopes
from trayapp.jobs.cgroups import NONE, V2, CgroupError, Offer, detect, tag_of
from trayapp.jobs.cgroups_v2 import (
    is_scope_of,
    max_above,
    parse_limit,
    parse_pressure,
    scope_name,
    start_argv,
)
from trayapp.jobs.scopes import ScopeCgroup, reading_v2

MiB = 1024 * 1024
SERVICE = "user.slice/user-1000.slice/user@1000.service"
ENGINE = f"0::/{SERVICE}/app.slice/tray.scope\n"
STAT = "anon 104857600\nfile 8388608\ninactive_file 4194304\nshmem 0\n"
EVENTS = "low 0\nhigh {high}\nmax 0\noom 0\noom_kill {oom}\noom_group_kill 0\n"
PRESSURE = ("some avg10={some:.2f} avg60=1.00 avg300=0.50 total=12345\n"
            "full avg10={full:.2f} avg60=0.80 avg300=0.40 total=2345\n")


def which(name: str) -> Optional[str]:
    return f"/usr/bin/{name}"


def fake_v2(tmp: Path, controllers: str = "cpu memory pids") -> Dict[str, Any]:
    """A unified cgroupfs (root), the user's manager's folder, its runtime folder with the
    private socket and the bus, and /proc/self/cgroup of an engine in a scope below it."""
    root = tmp / "cgroup"
    service = root / SERVICE
    service.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu io memory pids\n")
    (service / "cgroup.controllers").write_text(controllers + "\n")
    runtime = tmp / "run"
    (runtime / "systemd").mkdir(parents=True)
    (runtime / "systemd" / "private").write_text("")
    (runtime / "bus").write_text("")
    proc = tmp / "proc-self-cgroup"
    proc.write_text(ENGINE)
    return {"root": root, "service": service, "proc": proc,
            "env": {"XDG_RUNTIME_DIR": str(runtime)}, "runtime": runtime}


def offer_of(t: Dict[str, Any], **kw: Any) -> Offer:
    return detect(str(t["root"]), str(t["proc"]), environ=kw.pop("environ", t["env"]),
                  uid=1000, which=kw.pop("which", which), **kw)


# -- what the machine offers ---------------------------------------------------------------------


def test_a_user_manager_with_the_memory_controller_is_the_v2_brake(tmp_path: Path) -> None:
    t = fake_v2(tmp_path)
    offer = offer_of(t)
    assert offer.kind == V2 and offer.brakes
    assert offer.words == "kernel brake (cgroup v2, systemd)" and offer.tag == "brake-v2"
    assert offer.memory_parent == str(t["service"]) and offer.memory_mount == str(t["root"])
    assert offer.to_json() == {"kind": "v2", "words": "kernel brake (cgroup v2, systemd)",
                               "tag": "brake-v2", "why": "transient scopes of user@1000.service",
                               "freezer": True}
    assert tag_of(offer.words) == "brake-v2"
    line = cgroups.plan_line(True, 800, offer)
    assert line.startswith("protection: kernel brake (cgroup v2, systemd): the kernel holds "
                           "the job at the smaller of its budget (800.0 MiB)")
    assert "memory.high" in line and "a pause freezes its cgroup" in line


def test_an_engine_in_a_login_session_is_placed_through_the_manager_too(tmp_path: Path) -> None:
    t = fake_v2(tmp_path)
    t["proc"].write_text("0::/user.slice/user-1000.slice/session-2.scope\n")
    assert offer_of(t).kind == V2


@pytest.mark.parametrize("case, why", [
    ("not-v2", "is not a cgroup v2 hierarchy"),
    ("no-manager", "cgroup v2 without a running systemd user manager (user@1000.service)"),
    ("no-service", "cgroup v2 without a cgroup for user@1000.service (no systemd delegation)"),
    ("no-memory", "the memory controller is not delegated to user@1000.service"),
    ("read-only", "is read-only"),
    ("not-writable", "is not delegated to this user (not writable)"),
    ("no-bus", "no user D-Bus"),
    ("no-busctl", "busctl (systemd) is not on PATH"),
])
def test_each_thing_v2_lacks_is_one_line_and_the_guard_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, why: str) -> None:
    t = fake_v2(tmp_path, controllers="cpu pids" if case == "no-memory" else "cpu memory pids")
    kw: Dict[str, Any] = {}
    if case == "not-v2":
        (t["root"] / "cgroup.controllers").unlink()
    elif case == "no-manager":
        (t["runtime"] / "systemd" / "private").unlink()
        t["proc"].write_text("0::/user.slice/user-1000.slice/session-2.scope\n")
    elif case == "no-service":
        os.rename(t["service"], t["root"] / "elsewhere")
    elif case == "read-only":
        real = os.statvfs

        class ReadOnly:
            f_flag = os.ST_RDONLY

        monkeypatch.setattr(os, "statvfs", lambda p: ReadOnly() if "cgroup" in str(p)
                            else real(p))
    elif case == "not-writable":
        monkeypatch.setattr(os, "access", lambda p, mode: False)
    elif case == "no-bus":
        (t["runtime"] / "bus").unlink()
    elif case == "no-busctl":
        kw["which"] = lambda name: None
    offer = offer_of(t, **kw)
    assert offer.kind == NONE and not offer.brakes
    assert why in offer.why and "\n" not in offer.why
    assert offer.words.startswith("none: the guard only (")
    assert offer.to_json()["kind"] == NONE


def test_a_hybrid_machine_with_v1_memory_is_not_taken_for_v2(tmp_path: Path) -> None:
    t = fake_v2(tmp_path)
    t["proc"].write_text("4:memory:/x\n" + ENGINE)
    assert offer_of(t).kind != V2


# -- the files, read -----------------------------------------------------------------------------


def test_pressure_limits_and_names_are_read() -> None:
    psi = parse_pressure(PRESSURE.format(some=85.5, full=27.25) + "garbage\nfull x=y\n")
    assert psi["some"]["avg10"] == 85.5 and psi["some"]["total"] == 12345
    assert psi["full"] == {}  # the last "full" line (garbage) is what was read
    assert parse_pressure(PRESSURE.format(some=1, full=2))["full"]["avg10"] == 2.0
    assert parse_limit("max\n") is None and parse_limit("209715200\n") == 200 * MiB
    with pytest.raises(ValueError):
        parse_limit("lots")
    assert max_above(200 * MiB) == 328 * MiB and max_above(4096 * MiB) == 5120 * MiB
    assert scope_name("headroom-job-", "ab12", 77) == "headroom-job-ab12-77.scope"
    assert is_scope_of("headroom-job-ab12-77.scope", "headroom-job-", "ab12")
    assert is_scope_of("headroom-job-ab12.scope", "headroom-job-", "ab12")
    assert not is_scope_of("headroom-job-ab123-7.scope", "headroom-job-", "ab12")
    argv = start_argv("headroom-job-ab12-77.scope", 77, "Headroom job ab12")
    assert argv[:4] == ["busctl", "--user", "--quiet", "call"]
    assert "StartTransientUnit" in argv and argv[argv.index("PIDs") + 3] == "77"


def test_a_job_at_its_high_limit_and_throttled_is_held() -> None:
    high = str(200 * MiB)
    at = str(200 * MiB - 4096)
    r = reading_v2(at, high, STAT, EVENTS.format(high=935, oom=0),
                   PRESSURE.format(some=3, full=1), True)
    assert r.under_oom and r.limit == 200 * MiB and r.usage == 200 * MiB - 4096
    assert r.anon == 100 * MiB and r.file == 8 * MiB and r.inactive_file == 4 * MiB
    assert r.held == 200 * MiB  # what it needs: at least its limit
    assert r.high_events == 935 and r.failcnt == 935 and r.oom_kill == 0
    j = r.to_json()
    assert j["high_events"] == 935 and j["psi_full_avg10"] == 1.0 and j["max_events"] == 0
    # Not throttled lately, but its tasks stall: held too.
    assert reading_v2(at, high, STAT, EVENTS.format(high=935, oom=0),
                      PRESSURE.format(some=90, full=40), False).under_oom
    # Neither: at its limit, going on.
    assert not reading_v2(at, high, STAT, EVENTS.format(high=935, oom=0),
                          PRESSURE.format(some=3, full=1), False).under_oom
    # Throttled a while ago and well under its limit now: not held.
    assert not reading_v2(str(100 * MiB), high, STAT, EVENTS.format(high=9, oom=0), "",
                          True).under_oom
    # No limit: never held; PSI off (no file): None.
    free = reading_v2(at, "max\n", STAT, EVENTS.format(high=0, oom=1), "", True)
    assert free.limit is None and not free.under_oom and free.psi_full is None
    assert free.oom_kill == 1
    with pytest.raises(ValueError):
        reading_v2("x", high, STAT, "", "", False)


# -- a job's scope -------------------------------------------------------------------------------


def fake_scope(t: Dict[str, Any], name: str = "headroom-job-j1-4242.scope") -> Path:
    folder = t["service"] / "app.slice" / name
    folder.mkdir(parents=True)
    for f, text in {"memory.current": str(150 * MiB), "memory.high": "max",
                    "memory.max": "max", "memory.stat": STAT,
                    "memory.events": EVENTS.format(high=0, oom=0),
                    "memory.pressure": PRESSURE.format(some=0, full=0),
                    "memory.peak": str(180 * MiB), "cgroup.procs": "4242\n4243\n",
                    "cgroup.freeze": "0\n", "cgroup.events": "populated 1\nfrozen 0\n",
                    "cgroup.kill": ""}.items():
        (folder / f).write_text(text)
    return folder


def fake_proc(tmp: Path, pid: int, path: str) -> Path:
    proc = tmp / "proc"
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "cgroup").write_text(f"0::{path}\n")
    return proc


def test_a_scope_is_asked_for_and_the_job_found_in_it(tmp_path: Path) -> None:
    t = fake_v2(tmp_path)
    offer = offer_of(t)
    proc = fake_proc(tmp_path, 4242, f"/{SERVICE}/app.slice/tray.scope")
    asked: List[List[str]] = []

    def ask(argv: List[str], env: dict) -> subprocess.CompletedProcess:
        asked.append(argv)
        assert env["XDG_RUNTIME_DIR"] == t["env"]["XDG_RUNTIME_DIR"]
        fake_scope(t)  # the manager makes it and moves the job in
        fake_proc(tmp_path, 4242, f"/{SERVICE}/app.slice/headroom-job-j1-4242.scope")
        return subprocess.CompletedProcess(argv, 0, "", "")

    scope = ScopeCgroup.start(offer, "j1", 4242, proc=str(proc), ask=ask, environ=t["env"])
    assert asked and asked[0][asked[0].index("StartTransientUnit") + 2] == \
        "headroom-job-j1-4242.scope"
    assert scope.memory == str(t["service"] / "app.slice" / "headroom-job-j1-4242.scope")
    assert scope.freezer == scope.memory and scope.pids() == [4242, 4243]
    again = ScopeCgroup.of_process(offer, 4242, "j1", proc=str(proc))
    assert again is not None and again.memory == scope.memory
    assert ScopeCgroup.of_process(offer, 4242, "other", proc=str(proc)) is None


def test_a_manager_that_refuses_or_is_too_slow_is_one_line(tmp_path: Path) -> None:
    t = fake_v2(tmp_path)
    offer = offer_of(t)
    proc = fake_proc(tmp_path, 4242, f"/{SERVICE}/app.slice/tray.scope")

    def refuse(argv: List[str], env: dict) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(
            argv, 1, "", "Call failed: Unit headroom-job-j1-4242.scope already exists.\n")

    with pytest.raises(CgroupError, match=r"^the systemd user manager made no scope for it: "
                       r"Call failed: Unit headroom-job-j1-4242.scope already exists.$"):
        ScopeCgroup.start(offer, "j1", 4242, proc=str(proc), ask=refuse, environ={})

    def accept(argv: List[str], env: dict) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(argv, 0, "", "")

    with pytest.raises(CgroupError, match="did not move it into headroom-job-j1-4242.scope "
                       "within 0.05 s"):
        ScopeCgroup.start(offer, "j1", 4242, proc=str(proc), ask=accept, environ={}, wait=0.05)
    with pytest.raises(CgroupError, match="it ended before its scope was made"):
        ScopeCgroup.start(offer, "j1", 999, proc=str(proc), ask=accept, environ={})

    def missing(argv: List[str], env: dict) -> subprocess.CompletedProcess:
        raise FileNotFoundError(2, "No such file or directory", "busctl")

    with pytest.raises(CgroupError, match="cannot ask the systemd user manager for a scope"):
        ScopeCgroup.start(offer, "j1", 4242, proc=str(proc), ask=missing, environ={})
    with pytest.raises(CgroupError, match="no systemd scopes for jobs here"):
        ScopeCgroup.start(Offer(NONE, "x"), "j1", 4242, proc=str(proc), ask=accept)


def test_the_limit_is_memory_high_with_memory_max_above_it(tmp_path: Path) -> None:
    folder = fake_scope(fake_v2(tmp_path))
    scope = ScopeCgroup(str(folder), folder.name)
    scope.set_limit(400 * MiB)
    assert (folder / "memory.high").read_text() == str(400 * MiB)
    assert (folder / "memory.max").read_text() == str(max_above(400 * MiB))
    scope.set_limit(300 * MiB)
    assert (folder / "memory.high").read_text() == str(300 * MiB)
    assert (folder / "memory.max").read_text() == str(max_above(300 * MiB))
    assert scope.read().limit == 300 * MiB
    scope.set_limit(-1)
    assert (folder / "memory.high").read_text() == "max"
    assert (folder / "memory.max").read_text() == "max" and scope.read().limit is None


def test_held_is_high_events_rising_lately(tmp_path: Path) -> None:
    folder = fake_scope(fake_v2(tmp_path))
    now = [100.0]
    scope = ScopeCgroup(str(folder), folder.name, clock=lambda: now[0])
    (folder / "memory.high").write_text(str(150 * MiB))
    (folder / "memory.events").write_text(EVENTS.format(high=10, oom=0))
    assert not scope.read().under_oom  # the first look: no rise seen yet
    (folder / "memory.events").write_text(EVENTS.format(high=900, oom=0))
    now[0] = 100.5
    assert scope.read().under_oom
    now[0] = 101.0
    assert scope.read().under_oom  # another look right after (the guard's): still held
    now[0] = 100.5 + cgroups_v2.HIGH_WINDOW_SECONDS + 0.1
    assert not scope.read().under_oom  # no rise for a window: it goes on
    assert scope.peak() == 180 * MiB
    (folder / "memory.peak").unlink()
    assert scope.peak() == 150 * MiB


def test_freeze_thaw_kill_and_let_go(tmp_path: Path) -> None:
    folder = fake_scope(fake_v2(tmp_path))
    scope = ScopeCgroup(str(folder), folder.name)
    assert scope.freezer_state() == "THAWED"
    assert scope.freeze() and (folder / "cgroup.freeze").read_text() == "1"
    assert scope.freezer_state() == "FREEZING"
    (folder / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    assert scope.freezer_state() == "FROZEN"
    assert scope.thaw() and (folder / "cgroup.freeze").read_text() == "0"
    assert scope.kill() == 2 and (folder / "cgroup.kill").read_text() == "1"
    scope.set_limit(300 * MiB)
    (folder / "cgroup.freeze").write_text("1")
    scope.remove()  # let go of: its limits lifted, thawed; the folder is the manager's
    assert (folder / "memory.high").read_text() == "max"
    assert (folder / "cgroup.freeze").read_text() == "0" and folder.is_dir()


def test_a_scope_gone_under_a_job_is_one_line(tmp_path: Path) -> None:
    folder = fake_scope(fake_v2(tmp_path))
    scope = ScopeCgroup(str(folder), folder.name)
    for f in folder.iterdir():
        f.unlink()
    folder.rmdir()
    for act in (scope.read, lambda: scope.set_limit(MiB), scope.freeze, scope.pids):
        with pytest.raises(CgroupError, match=f"^its scope {folder} is gone$"):
            act()
    scope.remove()  # nothing to do, and no error


# -- the job manager places a job in one ---------------------------------------------------------


def test_the_manager_places_a_job_in_a_scope_or_guards_it_without(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from tests.unit.test_braking import Manager, braked_job

    t = fake_v2(tmp_path)
    m = Manager()
    m._offer = (True, offer_of(t))
    proc = fake_proc(tmp_path, 4242, f"/{SERVICE}/app.slice/tray.scope")
    monkeypatch.setattr(scopes, "PROC", str(proc))

    def ask(argv: List[str], env: dict) -> subprocess.CompletedProcess:
        fake_scope(t)
        fake_proc(tmp_path, 4242, f"/{SERVICE}/app.slice/headroom-job-j1-4242.scope")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(scopes, "_ask", ask)
    job = braked_job()
    m.cgroup_place(job, 4242)
    assert isinstance(job.cgroup, ScopeCgroup)
    assert job.rec.protection == "kernel brake (cgroup v2, systemd)"
    folder = Path(job.cgroup.memory)
    assert (folder / "memory.high").read_text() == str(1350 * MiB)  # its budget

    def refuse(argv: List[str], env: dict) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(argv, 1, "", "Failed to connect to bus\n")

    monkeypatch.setattr(scopes, "_ask", refuse)
    other = braked_job(id="j2")
    with caplog.at_level(logging.WARNING, logger="headroom.jobs"):
        m.cgroup_place(other, 4242)
    assert other.cgroup is None
    assert other.rec.protection == ("none: the guard only (the systemd user manager made no "
                                    "scope for it: Failed to connect to bus)")
    assert [r.getMessage() for r in caplog.records] == [
        "job j2: the systemd user manager made no scope for it: Failed to connect to bus; it "
        "is guarded without the kernel brake"]


def test_an_oom_kill_is_read_from_the_scope_or_from_the_manager_once_it_is_gone(
        tmp_path: Path) -> None:
    folder = fake_scope(fake_v2(tmp_path))
    scope = ScopeCgroup(str(folder), folder.name)
    assert scope.oom_killed(0) is None
    (folder / "memory.events").write_text(EVENTS.format(high=0, oom=1))
    assert scope.oom_killed(0) == 180 * MiB  # its memory.peak
    assert scope.oom_killed(1) is None
    scope.set_limit(200 * MiB)
    for f in folder.iterdir():
        f.unlink()
    folder.rmdir()  # the manager removed it as its last process died
    asked: List[List[str]] = []

    def manager(result: str) -> Any:
        def ask(argv: List[str], env: dict) -> subprocess.CompletedProcess:
            asked.append(argv)
            return subprocess.CompletedProcess(argv, 0, result + "\n", "")
        return ask

    assert scope.oom_killed(1, ask=manager("oom-kill")) == 200 * MiB  # at least its limit
    assert asked == [cgroups_v2.result_argv(folder.name), cgroups_v2.reset_argv(folder.name)]
    assert scope.oom_killed(1, ask=manager("success")) is None
    assert scope.oom_killed(0, ask=manager("")) == 200 * MiB  # seen before it went


def test_a_scope_the_kernel_is_removing_is_gone_and_its_oom_kill_asked_of_the_manager(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Between the last process's death and the folder's removal, its files answer ENODEV
    # (seen in the VM): that is a scope gone, not a fault.
    import builtins
    import errno

    folder = fake_scope(fake_v2(tmp_path))
    scope = ScopeCgroup(str(folder), folder.name)
    real_open = builtins.open

    def removing(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).startswith(str(folder)):
            raise OSError(errno.ENODEV, "No such device")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", removing)
    with pytest.raises(CgroupError, match=f"^its scope {folder} is gone$"):
        scope.read()
    with pytest.raises(CgroupError, match=f"^its scope {folder} is gone$"):
        scope.set_limit(MiB)
    said = subprocess.CompletedProcess([], 0, "oom-kill\n", "")
    assert scope.oom_killed(0, ask=lambda argv, env: said) is not None
