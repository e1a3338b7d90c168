"""``headroom status``: RAM, swap, pressure, the GPUs, the guard and the jobs, from the engine or,
when none runs, read from the probes now."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import List, Optional

from trayapp import __version__, formats
from trayapp.cli.base import EXIT_OK, demo, say, show
from trayapp.cli.jobs import exit_text, progress_text
from trayapp.config import Paths
from trayapp.engine.client import EngineBusy, EngineClient, EngineUnavailable, UnsafeState
from trayapp.engine.status_record import EngineView, GuardView, Status
from trayapp.jobs.record import JobRecord
from trayapp.probes.gpu import make_backend
from trayapp.probes.memory import make_memory_probe
from trayapp.readings import MemoryReading
from trayapp.text import lines as escaped_lines
from trayapp.text import one_line

STATUS_TIMEOUT_SECONDS = 5.0
CLEAR_SCREEN = "\x1b[H\x1b[2J"

_fmt = formats.format_bytes


def format_status(st: Status) -> str:
    """The status as a compact, glanceable text (one block per part), each line escaped as
    ``text.one_line`` does."""
    lines = _head_lines(st.engine, st.guard)
    lines += _memory_lines(st.memory)
    lines += _gpu_lines(st)
    lines += _metrics_lines(st.engine)
    words = st.engine.protection.get("words")
    if words:
        lines.append(f"Protection {one_line(str(words))}")
    if not st.jobs:
        lines.append("Jobs   none")
    for jb in st.jobs:
        lines.append("Job    " + format_job_line(jb))
    # Each line escaped: jobs' names, GPU processes' names and the guard's reasons are shown.
    return escaped_lines("\n".join(lines))


def _head_lines(eng: EngineView, guard: GuardView) -> List[str]:
    if eng.running:
        head = f"engine running (pid {eng.pid}) · guard {guard.state_words()}"
        runs_out = guard.runs_out()
        if runs_out:
            head += f" · {runs_out}"
    else:
        head = "no engine is running: readings taken now; the guard is not watching"
    lines = [f"Headroom {__version__} · {head}"]
    lines += [f"  ! {reason}" for reason in guard.reasons]
    lines += [f"  ! {one_line(problem)}" for problem in eng.config_problems]
    return lines


def _metrics_lines(eng: EngineView) -> List[str]:
    """Where the Prometheus exporter serves, or why it does not; nothing when it is off."""
    metrics = eng.metrics
    if metrics.get("error"):
        return [f"Metrics ! {one_line(str(metrics['error']))}"]
    if metrics.get("listen"):
        scheme = "https" if metrics.get("tls") else "http"
        return [f"Metrics {scheme}://{metrics['listen']}/metrics (for Prometheus)"]
    return []


def _memory_lines(m: Optional[MemoryReading]) -> List[str]:
    if m is None:
        return ["RAM    n/a"]
    limit = "cgroup limit" if m.limit_source == "cgroup" else "host"
    lines = [
        f"RAM    {_fmt(m.available_bytes)} available of {_fmt(m.total_bytes)} ({limit}), "
        f"{formats.percent(m.used_bytes, m.total_bytes)} used"
    ]
    if m.swap_total_bytes:
        lines.append(f"Swap   {_fmt(m.swap_used_bytes)} used of {_fmt(m.swap_total_bytes)}")
    else:
        lines.append("Swap   none")
    if m.psi_some_avg10 is None:
        lines.append("Pressure n/a (this kernel does not report memory pressure)")
    else:
        lines.append(
            f"Pressure some {m.psi_some_avg10:.1f}%  full {m.psi_full_avg10 or 0:.1f}%  (avg10)"
        )
    return lines


def _gpu_lines(st: Status) -> List[str]:
    gpu_status = st.gpu_status
    lines = []
    if not st.gpus:
        lines.append(f"GPU    {gpu_status.message or 'no NVIDIA GPU found'}")
    for g in st.gpus:
        sim = " [simulated]" if g.simulated else ""
        lines.append(
            f"GPU {g.index}  {g.name}{sim} | {_fmt(g.memory_used_bytes)} / "
            f"{_fmt(g.memory_total_bytes)} | util {formats.number(g.utilization_percent, '%')}"
            f" | {formats.number(g.temperature_c, '°C')} | {formats.number(g.power_watts, ' W')}"
        )
        if g.processes:
            lines.append(
                "       "
                + ", ".join(f"{p.name} ({p.pid}) {_fmt(p.used_memory_bytes)}" for p in g.processes)
            )
    if gpu_status.driver_version:
        lines.append(
            f"       driver {gpu_status.driver_version}, CUDA "
            f"{gpu_status.cuda_driver_version or 'n/a'}"
        )
    return lines


def format_job_line(jb: JobRecord) -> str:
    """A job in one line: its name, then what ``headroom run`` shows of its progress."""
    text = f"{jb.name} {progress_text(jb)}"
    status = exit_text(jb)
    return text + f" · {status}" if status else text


def local_status(demo: bool) -> Status:
    """The status read from the probes directly, for when no engine runs."""
    backend = make_backend(demo=demo)
    try:
        memory = make_memory_probe().read()
        return Status(
            memory.time,
            memory,
            tuple(backend.read()),
            backend.status,
            guard=GuardView(state=None, mode=None, reasons=("no engine is running",)),
            engine=EngineView(running=False),
            guard_json={"state": None, "mode": None, "reasons": ["no engine is running"]},
        )
    finally:
        backend.close()


def _read_status(client: EngineClient, args: argparse.Namespace) -> Optional[Status]:
    """The engine's status, the probes' when no engine runs; None when a busy engine did not
    answer while watching (said on stderr)."""
    try:
        return client.status()
    except UnsafeState:
        raise  # an engine folder that cannot be trusted is said, not hidden
    except EngineBusy as e:
        # An engine runs: readings of our own would say it does not. Once: exit 3;
        # watching: say so and try again at the next refresh.
        if not args.watch:
            raise
        say(e)
        return None
    except EngineUnavailable:
        return local_status(demo(args))


def cmd_status(args: argparse.Namespace, paths: Paths) -> int:
    client = EngineClient(paths, timeout=STATUS_TIMEOUT_SECONDS)
    tty = sys.stdout.isatty()
    try:
        while True:
            st = _read_status(client, args)
            if st is None:
                pass
            elif args.json:
                print(json.dumps(st.to_json()), flush=True)
            else:
                text = format_status(st)
                if args.watch and tty:
                    sys.stdout.write(CLEAR_SCREEN + text + "\n")
                    sys.stdout.flush()
                else:
                    show(text)
            if not args.watch:
                return EXIT_OK
            time.sleep(args.watch)
            if not tty and not args.json:
                print()
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        client.close()
