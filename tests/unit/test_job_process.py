"""A job's process, piece by piece: the log's trim (head, tail, marker, a writer appending all the
while), output streams that a full disk or a closed pipe cannot crash, the runner's priority,
the settings and the plan that carry them, and every logger under ``headroom``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List

import pytest

from trayapp import config as configmod
from trayapp.jobs.logcap import LogKeeper
from trayapp.jobs.options import JobSpec
from trayapp.jobs.plan import JobProcess, build_launch, format_plan, process_lines
from trayapp.runner import joblog, priority, protocol
from trayapp.runner.job import process_settings

REPO = Path(__file__).resolve().parents[2]
RUNNER = REPO / "trayapp" / "runner"
KiB, MiB = 1 << 10, 1 << 20

posix_only = pytest.mark.skipif(not joblog.SUPPORTED, reason="the cap needs O_APPEND and flock")


def numbered(n: int, start: int = 0) -> bytes:
    return b"".join(b"line %08d %s\n" % (i, b"z" * 40) for i in range(start, start + n))


def marker_count(data: bytes) -> List[int]:
    return [int(m) for m in re.findall(rb"\n\[headroom: ([0-9]+) bytes of output dropped", data)]


# -- the trim -----------------------------------------------------------------------------------


@posix_only
@pytest.mark.parametrize("kernel_copy", [True, False], ids=["copy_file_range", "buffer"])
def test_a_trim_keeps_the_head_and_the_tail_and_counts_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_copy: bool) -> None:
    if not kernel_copy:
        monkeypatch.delattr(os, "copy_file_range", raising=False)
    elif not hasattr(os, "copy_file_range"):
        pytest.skip("no copy_file_range here")
    cap = 256 * KiB
    log = tmp_path / "log"
    original = numbered(20000)  # about 1 MiB
    log.write_bytes(original)
    dropped = joblog.trim(str(log), cap)
    data = log.read_bytes()
    assert len(data) <= cap
    head = joblog.head_bytes(cap)
    assert data[:head] == original[:head]
    assert marker_count(data) == [dropped]
    # The tail starts at a line and is the end of the original, byte for byte.
    tail = data[data.index(b"(setting jobs.log_max_mb)]\n") + len(b"(setting jobs.log_max_mb)]\n"):]
    assert tail.startswith(b"line ") and original.endswith(tail)
    assert len(tail) <= joblog.tail_bytes(cap)
    assert head + dropped + len(tail) == len(original)

    # More output and a second trim: one marker, counting everything dropped so far.
    more = numbered(20000, start=20000)
    with open(log, "ab") as f:
        f.write(more)
    second = joblog.trim(str(log), cap)
    data = log.read_bytes()
    assert len(data) <= cap and second > 0
    assert marker_count(data) == [dropped + second]
    assert data[:head] == original[:head] and (original + more).endswith(data[-1000:])
    mark = joblog.marker(dropped + second, cap)
    assert len(data) - len(mark) + dropped + second == len(original) + len(more)
    with open(log, "rb") as f:
        assert joblog.marker_offset(f.fileno(), cap) == head


@posix_only
def test_a_log_within_its_cap_or_its_slack_is_left_alone(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_bytes(numbered(1000))
    size = log.stat().st_size
    assert joblog.trim(str(log), size) == 0
    assert joblog.trim(str(log), size - 10, slack=10) == 0
    assert log.stat().st_size == size
    with open(log, "rb") as f:
        assert joblog.marker_offset(f.fileno(), size) is None
    assert joblog.trim(str(log), size - 10) > 0


@posix_only
def test_a_trim_while_a_writer_appends_leaves_whole_lines_in_order(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_bytes(b"")
    done = tmp_path / "lines-written"
    # Its last line comes once the trims have stopped: one written inside a trim's window
    # (between its last read and its truncation) is lost without the runner's lock.
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, sys
        fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
        for i in range(200000):
            os.write(fd, b"line %08d %s\\n" % (i, b"z" * 40))
        open(sys.argv[2], "w").close()
        sys.stdin.read()
        os.write(fd, b"THE END\\n")
    """), str(log), str(done)], stdin=subprocess.PIPE)
    cap = 128 * KiB
    trims = 0
    try:
        while not done.exists() and writer.poll() is None:
            trims += bool(joblog.trim(str(log), cap))
        assert writer.stdin is not None
        writer.stdin.close()
        writer.wait(60)
    finally:
        writer.kill()
        writer.wait()
    assert writer.returncode == 0
    joblog.trim(str(log), cap)
    data = log.read_bytes()
    assert trims >= 3 and len(data) <= cap
    assert data.endswith(b"\nTHE END\n")
    head = joblog.head_bytes(cap)
    assert marker_count(data[head:head + joblog.MARKER_MAX])  # the marker sits at the head's end
    rest = data[head:].split(b"\n", 2)[2]  # after the marker's line
    cut = data[:head].split(b"\n")[-1]  # the head ends in the middle of a line
    # A writer that bypasses the runner (no lock) may lose what it appends in the instant
    # between a trim's last read and its truncation: at most one torn line per trim.
    numbers, torn = [], []
    for chunk in data[:head - len(cut)].split(b"\n")[:-1] + rest.split(b"\n")[:-2]:
        if re.fullmatch(rb"line [0-9]{8} z{40}", chunk):
            numbers.append(int(chunk[5:13]))
        else:
            torn.append(chunk)
    assert len(torn) <= trims, torn[:3]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    assert numbers[0] == 0 and numbers[-1] == 199999


@posix_only
def test_the_log_keeper_trims_past_the_slack_and_once_more_at_the_end(tmp_path: Path) -> None:
    cap = 512 * KiB
    log = tmp_path / "log"
    running = [(str(log), cap)]
    keeper = LogKeeper(lambda: list(running))
    log.write_bytes(numbered(cap // 50 + 100))  # a little over the cap: within the slack
    keeper.check()
    assert log.stat().st_size > cap
    with open(log, "ab") as f:
        f.write(numbered(joblog.engine_slack(cap) // 50 + 100))
    keeper.check()
    assert log.stat().st_size <= cap
    with open(log, "ab") as f:
        f.write(numbered(cap // 100 + 100))
    keeper.check()
    assert log.stat().st_size > cap
    running.clear()  # the job ended: its log goes back under the cap itself
    keeper.check()
    assert log.stat().st_size <= cap
    keeper.close()


# -- output that cannot crash the job -----------------------------------------------------------

GUARDED = """
import sys
sys.path.insert(0, {runner!r})
import joblog
warnings = []
out = joblog.guard_output()
out.on_drop = warnings.append
for i in range(2000):
    print("line", i, "x" * 100)
    sys.stderr.write("err %d\\n" % i)
sys.stdout.flush()
with open({report!r}, "w") as f:
    f.write("\\n".join(warnings))
sys.exit(7)
"""


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_drops_output_with_one_warning_and_the_real_exit_status(
        tmp_path: Path) -> None:
    report = tmp_path / "warnings"
    script = GUARDED.format(runner=str(RUNNER), report=str(report))
    with open("/dev/full", "wb") as full:  # every write: ENOSPC
        r = subprocess.run([sys.executable, "-c", script], stdout=full, stderr=full)
    assert r.returncode == 7
    warnings = report.read_text().splitlines()
    assert len(warnings) == 1
    assert "No space left on device" in warnings[0] and "the job goes on" in warnings[0]
    # Without the guard the same script dies of its first print.
    bare = script.replace("out = joblog.guard_output()", "out = joblog._Output()")
    with open("/dev/full", "wb") as full:
        assert subprocess.run([sys.executable, "-c", bare], stdout=full,
                              stderr=full).returncode != 7


def test_a_reader_gone_is_no_broken_pipe(tmp_path: Path) -> None:
    report = tmp_path / "warnings"
    script = GUARDED.format(runner=str(RUNNER), report=str(report))
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # the reader goes away before the job writes a line
    p.stderr.close()
    assert p.wait(60) == 7
    assert "Broken pipe" in report.read_text()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_output_says_what_was_dropped_once_it_can_write_again(tmp_path: Path) -> None:
    log = tmp_path / "log"
    fd = os.open("/dev/full", os.O_WRONLY)
    out = joblog._Output()
    warnings: List[str] = []
    out.on_drop = warnings.append
    writer = joblog.SafeWriter(fd, out, "<test>")
    try:
        assert writer.write(b"lost 1\n") == 7
        assert writer.write(b"lost 2\n") == 7
        good = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(good, fd)  # the disk has room again
        os.close(good)
        writer.write(b"kept\n")
    finally:
        os.close(fd)
    assert len(warnings) == 1
    assert log.read_bytes() == (b"[headroom: 14 bytes of output were dropped here: "
                                b"No space left on device]\nkept\n")


def test_a_warning_from_before_the_channel_reaches_it_later() -> None:
    out = joblog._Output()
    out.lost(10, OSError(28, "No space left on device"))
    out.lost(10, OSError(28, "No space left on device"))
    got: List[str] = []
    out.on_drop = got.append
    assert len(got) == 1 and "No space left on device" in got[0]


# -- priority -----------------------------------------------------------------------------------

PRIORITY = """
import json, os, sys, threading
sys.path.insert(0, {runner!r})
import priority
start = os.getpriority(os.PRIO_PROCESS, 0)
problems = priority.apply({nice!r}, {oom!r})
seen = []
t = threading.Thread(target=lambda: seen.append(os.getpriority(os.PRIO_PROCESS, 0)))
t.start(); t.join()
child = os.fork()
if child == 0:
    os._exit(10 + os.getpriority(os.PRIO_PROCESS, 0))
_, status = os.waitpid(child, 0)
with open("/proc/self/oom_score_adj") as f:
    oom = int(f.read())
print(json.dumps({{"start": start, "nice": os.getpriority(os.PRIO_PROCESS, 0), "thread": seen[0],
                  "child": os.WEXITSTATUS(status) - 10, "oom": oom, "problems": problems}}))
"""

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")


def run_priority(nice, oom, start_nice: int = 0) -> dict:
    script = PRIORITY.format(runner=str(RUNNER), nice=nice, oom=oom)
    cmd = [sys.executable, "-c", script]
    if start_nice:
        cmd = ["nice", "-n", str(start_nice)] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@linux_only
def test_the_runner_sets_an_absolute_nice_and_oom_score_for_every_thread_and_child() -> None:
    got = run_priority(7, 650)
    assert (got["nice"], got["thread"], got["child"], got["oom"]) == (7, 7, 7, 650)
    assert got["problems"] == []


@linux_only
@pytest.mark.skipif(os.geteuid() != 0, reason="starting below nice 0 needs root")
def test_a_job_started_above_the_desktop_comes_down_to_nice_0() -> None:
    got = run_priority(0, 500, start_nice=-5)
    assert got["start"] == -5
    assert (got["nice"], got["thread"], got["child"], got["oom"]) == (0, 0, 0, 500)


@linux_only
def test_nothing_asked_changes_nothing() -> None:
    got = run_priority(None, None, start_nice=3)
    assert got["nice"] == 3 and got["problems"] == []


def test_the_process_settings_are_read_defensively() -> None:
    assert process_settings(None) == {"nice": None, "oom_score_adj": None, "log": None,
                                      "log_max_bytes": None, "rlimits": None}
    assert process_settings('{"rlimits": [1]}')["rlimits"] is None
    assert process_settings("{not json")["nice"] is None
    assert process_settings("[1]")["log"] is None
    got = process_settings('{"nice": 25, "oom_score_adj": true, "log": "/x/log", '
                           '"log_max_bytes": 1048576}')
    assert got == {"nice": None, "oom_score_adj": None, "log": "/x/log",
                   "log_max_bytes": 1048576, "rlimits": None}


# -- settings and plan --------------------------------------------------------------------------


@pytest.mark.parametrize("text, name, default", [
    ("nice = -5", "jobs.nice", 0),
    ("nice = 20", "jobs.nice", 0),
    ("nice = 1.5", "jobs.nice", 0),
    ("oom_score_adj = -100", "jobs.oom_score_adj", 500),
    ("oom_score_adj = 1001", "jobs.oom_score_adj", 500),
    ("log_max_mb = 0", "jobs.log_max_mb", 32),
    ("log_max_mb = \"big\"", "jobs.log_max_mb", 32),
])
def test_bad_job_settings_name_the_key_and_use_the_default(tmp_path: Path, text: str,
                                                            name: str, default: int) -> None:
    path = tmp_path / "config.toml"
    path.write_text(f"[jobs]\n{text}\n")
    cfg = configmod.load(path)
    assert cfg[name] == default
    assert len(cfg.problems) == 1 and name in cfg.problems[0]
    assert f"using the default {default}" in cfg.problems[0]


def test_good_job_settings_reach_the_plan(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[jobs]\nnice = 19\noom_score_adj = 1000\nlog_max_mb = 5\n")
    cfg = configmod.load(path)
    assert cfg.problems == []
    process = JobProcess.from_config(cfg)
    assert process == JobProcess(nice=19, oom_score_adj=1000, log_max_bytes=5 * MiB)
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    plan = build_launch(JobSpec(script=str(script), python=sys.executable),
                        base_env={"PATH": "/usr/bin"}, process=process,
                        log_path="/home/u/jobs/abc/log")
    assert plan.process == process
    sent = json.loads(plan.env[protocol.ENV_PROCESS])
    assert sent["nice"] == 19 and sent["log"] == "/home/u/jobs/abc/log"
    assert sent["log_max_bytes"] == 5 * MiB
    assert process_settings(plan.env[protocol.ENV_PROCESS])["nice"] == 19
    text = format_plan(plan)
    assert "Process:\n  CPU priority: nice 19 " in text


def test_the_default_plan_runs_the_job_at_0_and_500() -> None:
    assert JobProcess.from_config(configmod.Config()) == JobProcess(0, 500, 32 * MiB)
    lines = process_lines(JobProcess(), platform="linux")
    assert lines[0].startswith("CPU priority: nice 0 ")
    assert lines[1].startswith("OOM killer: oom_score_adj +500 ")
    assert lines[2].startswith("Log: capped at 32.0 MiB (its first 4.0 MiB and its last 16.0")


def test_windows_says_what_applies_there() -> None:
    lines = process_lines(JobProcess(nice=5), platform="win32")
    assert "BELOW_NORMAL" in lines[0]
    assert lines[1] == "OOM killer: no OOM score on Windows"
    assert process_lines(JobProcess(), platform="win32")[0].startswith("CPU priority: normal")


# -- loggers ------------------------------------------------------------------------------------


def test_every_logger_of_the_package_is_under_headroom() -> None:
    """engine.log and the tray's log take the "headroom" tree: a logger outside it is lost."""
    names = []
    for path in (REPO / "trayapp").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "getLogger":
                arg = node.args[0] if node.args else None
                ok = isinstance(arg, ast.Constant) and isinstance(arg.value, str) and \
                    (arg.value == "headroom" or arg.value.startswith("headroom."))
                names.append((path.relative_to(REPO).as_posix(), node.lineno, ok))
    assert names, "no loggers found"
    assert [n for n in names if not n[2]] == []
    from trayapp.engine import store
    from trayapp.probes import nvml

    assert store.log.name.startswith("headroom.") and nvml.log.name.startswith("headroom.")


@linux_only
def test_the_shells_limits_are_applied_and_a_hard_one_above_the_jobs_is_said() -> None:
    """A limit below the process's is taken as it is; a hard one above its own (raising it
    needs privilege: run in a child that gave its own up) leaves the soft one as high as the
    hard allows, and one line says so."""
    code = (
        "import json, os, resource, sys\n"
        f"sys.path.insert(0, {str(Path(priority.__file__).parent)!r})\n"
        "import priority\n"
        "if os.geteuid() == 0:\n"  # as a user: raising a hard limit is then refused
        "    os.setgid(65534); os.setuid(65534)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))\n"
        "problems = priority.apply_limits({'AS': [1 << 33, 1 << 33], 'NOFILE': [400, 400],"
        " 'BOGUS': [1, 1], 'CORE': 'x'})\n"
        "print(json.dumps([resource.getrlimit(resource.RLIMIT_AS),"
        " resource.getrlimit(resource.RLIMIT_NOFILE), problems]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    space, files, problems = json.loads(out.stdout)
    assert space == [1 << 33, 1 << 33]
    assert files == [300, 300]
    assert problems == ["the job's hard limit NOFILE stays at the engine's (300), not 400"]
