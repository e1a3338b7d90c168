"""``headroom status``: RAM, swap, pressure, the GPUs, the guard and the jobs, from the engine or,
when none runs, read from the probes now."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Dict, List, Optional

from trayapp import __version__, formats
from trayapp.cli.base import EXIT_OK, demo, say, show
from trayapp.cli.jobs import exit_text, progress_text
from trayapp.config import Paths
from trayapp.engine.client import EngineBusy, EngineClient, EngineUnavailable, UnsafeState
from trayapp.jobs.record import JobRecord, records
from trayapp.probes.gpu import make_backend
from trayapp.probes.memory import make_memory_probe
from trayapp.probes.snapshot import GpuStatus, Snapshot, gpu_readings
from trayapp.text import lines as escaped_lines
from trayapp.text import one_line
from trayapp.vocab import GuardLevel

STATUS_TIMEOUT_SECONDS = 5.0
CLEAR_SCREEN = "\x1b[H\x1b[2J"

_fmt = formats.format_bytes


def format_status(st: Dict[str, Any]) -> str:
    """The status object as a compact, glanceable text (one block per part), each line
    escaped as ``text.one_line`` does."""
    lines = _head_lines(st.get("engine") or {}, st.get("guard") or {})
    lines += _memory_lines(st.get("memory") or {})
    lines += _gpu_lines(st)
    lines += _metrics_lines(st.get("engine") or {})
    protection = (st.get("engine") or {}).get("protection")
    if isinstance(protection, dict) and protection.get("words"):
        lines.append(f"Protection {one_line(str(protection['words']))}")
    jobs = records(st.get("jobs"))
    if not jobs:
        lines.append("Jobs   none")
    for jb in jobs:
        lines.append("Job    " + format_job_line(jb))
    # Each line escaped: jobs' names, GPU processes' names and the guard's reasons are shown.
    return escaped_lines("\n".join(lines))


def _head_lines(eng: Dict[str, Any], guard: Dict[str, Any]) -> List[str]:
    if eng.get("running"):
        head = f"engine running (pid {eng.get('pid')})"
        state = guard.get("state") or GuardLevel.OK
        mode = guard.get("mode")
        head += f" · guard {state}" + (f" ({mode})" if mode and mode != "act" else "")
        runs_out = formats.exhaustion_words(guard)
        if runs_out:
            head += f" · {runs_out}"
    else:
        head = "no engine is running: readings taken now; the guard is not watching"
    lines = [f"Headroom {__version__} · {head}"]
    lines += [f"  ! {reason}" for reason in guard.get("reasons") or []]
    lines += [f"  ! {one_line(str(problem))}" for problem in eng.get("config_problems") or []]
    return lines


def _metrics_lines(eng: Dict[str, Any]) -> List[str]:
    """Where the Prometheus exporter serves, or why it does not; nothing when it is off."""
    metrics = eng.get("metrics")
    if not isinstance(metrics, dict):
        return []
    if metrics.get("error"):
        return [f"Metrics ! {one_line(str(metrics['error']))}"]
    if metrics.get("listen"):
        scheme = "https" if metrics.get("tls") else "http"
        return [f"Metrics {scheme}://{metrics['listen']}/metrics (for Prometheus)"]
    return []


def _memory_lines(m: Dict[str, Any]) -> List[str]:
    limit = "cgroup limit" if m.get("limit_source", "host") == "cgroup" else "host"
    lines = [
        f"RAM    {_fmt(m.get('available_bytes'))} available of "
        f"{_fmt(m.get('total_bytes'))} ({limit}), "
        f"{formats.percent(m.get('used_bytes'), m.get('total_bytes'))} used"
    ]
    if m.get("swap_total_bytes"):
        lines.append(
            f"Swap   {_fmt(m.get('swap_used_bytes'))} used of {_fmt(m.get('swap_total_bytes'))}"
        )
    else:
        lines.append("Swap   none")
    if m.get("psi_some_avg10") is None:
        lines.append("Pressure n/a (this kernel does not report memory pressure)")
    else:
        lines.append(
            f"Pressure some {m['psi_some_avg10']:.1f}%  full "
            f"{m.get('psi_full_avg10') or 0:.1f}%  (avg10)"
        )
    return lines


def _gpu_lines(st: Dict[str, Any]) -> List[str]:
    gpu_status = GpuStatus.from_json(st.get("gpu_status") or {})
    gpus = gpu_readings(st.get("gpus"))
    lines = []
    if not gpus:
        lines.append(f"GPU    {gpu_status.message or 'no NVIDIA GPU found'}")
    for g in gpus:
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


def local_status(demo: bool) -> Dict[str, Any]:
    """The status read from the probes directly, for when no engine runs."""
    backend = make_backend(demo=demo)
    try:
        memory = make_memory_probe().read()
        snap = Snapshot(memory.time, memory, tuple(backend.read()), backend.status)
    finally:
        backend.close()
    mem = snap.memory.to_json()
    mem.pop("time", None)
    return {
        "time": snap.time,
        "memory": mem,
        "gpus": [g.to_json() for g in snap.gpus],
        "gpu_status": snap.gpu_status.to_json(),
        "guard": {
            "state": None,
            "mode": None,
            "reasons": ["no engine is running"],
            "seconds_to_exhaustion": None,
        },
        "jobs": [],
        "engine": {"running": False},
    }


def _read_status(client: EngineClient, args: argparse.Namespace) -> Optional[Dict[str, Any]]:
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
                print(json.dumps(st), flush=True)
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
