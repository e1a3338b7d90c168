"""The job commands of the command line: ``run``, ``jobs``, ``pause``, ``resume``, ``park``,
``stop`` and ``doctor``. Each is a client of the engine (``run`` starts one when none runs).

``headroom run`` exits with the script's exit status: 0 when it finished, its own status when it
failed (128 + N when signal N ended it), 130 when it was stopped with Ctrl-C, 75 (EX_TEMPFAIL,
``PARK_EXIT_CODE``) when it was parked and waits for ``headroom resume``, 76 (``STOP_EXIT_CODE``)
when it was stopped (``headroom stop``, the jobs window, the guard; with a checkpoint folder it
waits for ``headroom resume`` too), 1 when its end is unknown. A job that the guard parks and
will resume by itself is followed on.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import sys
import threading
import time
from typing import Any, Dict, List, Optional, TextIO, Tuple

from trayapp import vocab
from trayapp.cli_base import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError
from trayapp.config import Paths, format_bytes
from trayapp.runner.protocol import PARK_EXIT_CODE, STOP_EXIT_CODE
from trayapp.text import one_line

LIVE_STATES = vocab.LIVE
PROGRESS_TTY_SECONDS = 0.5  # the progress line is redrawn at most twice a second
PROGRESS_PLAIN_SECONDS = 2.0  # and printed as a plain line at most every 2 s
POLL_SECONDS = 0.2
LAST_LINES = 15  # of a failed job's log, shown when the output went elsewhere


def dispatch(args: argparse.Namespace, paths: Paths) -> int:
    """Run the job command ``args.command``; returns the exit status."""
    command = args.command
    if command == "run":
        return cmd_run(args, paths)
    if command == "jobs":
        return cmd_jobs(args, paths)
    if command in ("pause", "resume", "park", "stop"):
        return cmd_action(args, paths)
    if command == "doctor":
        return cmd_doctor(args, paths)
    raise UsageError(f"unknown command {command}")


def _say(message: str) -> None:
    print(f"headroom: {one_line(message)}", file=sys.stderr, flush=True)


# -- run ------------------------------------------------------------------------------------------


def _local_gpus(demo: bool) -> tuple:
    """GPU readings from the probes (for a dry run or checks before an engine answers)."""
    from trayapp.probes.gpu import make_backend

    backend = make_backend(demo=demo)
    try:
        return tuple(backend.read())
    finally:
        backend.close()


def cmd_run(args: argparse.Namespace, paths: Paths) -> int:
    from trayapp.engine.client import connect
    from trayapp.jobs.options import SpecError, spec_from_cli, validate

    try:
        spec = spec_from_cli(args)
    except SpecError as e:
        raise UsageError(one_line(e)) from None
    gpus = _local_gpus(bool(getattr(args, "demo", False)))
    try:
        warnings = validate(spec, gpus, check_paths=True)
    except SpecError as e:
        raise UsageError(one_line(e)) from None
    if getattr(args, "dry_run", False):
        return _dry_run(spec, paths, gpus)
    for w in warnings:
        _say(f"warning: {w}")
    client = connect(paths, start=True, demo=bool(getattr(args, "demo", False)),
                     config_file=getattr(args, "config", None))
    try:
        job = client.job_start(spec.to_json(), environ=dict(os.environ))
        follower = Follower(client, paths, job)
        follower.engine_options = {"demo": bool(getattr(args, "demo", False)),
                                   "config_file": getattr(args, "config", None)}
        return follower.run()
    finally:
        client.close()


def _dry_run(spec: Any, paths: Paths, gpus: tuple) -> int:
    from trayapp import config as configmod
    from trayapp.jobs.plan import JobProcess, build_launch, format_plan

    job_id = "dry-run"
    # The engine reads the same file: the priority and the log cap it would give the job.
    process = JobProcess.from_config(configmod.load(paths.config_file))
    try:
        plan = build_launch(spec, job_id=job_id, address=paths.job_address(job_id),
                            keyfile=str(paths.jobs_dir / job_id / "key"), gpus=gpus,
                            base_env=dict(os.environ), process=process,
                            log_path=str(paths.jobs_dir / job_id / "log"))
    except ValueError as e:
        raise UsageError(one_line(e)) from None
    print(format_plan(plan))
    return EXIT_OK


def _exit_status(job: Dict[str, Any], interrupted: bool) -> int:
    state = job.get("state")
    code = job.get("exit_code")
    if state == "finished":
        return EXIT_OK
    if state == "parked":
        return PARK_EXIT_CODE
    if state == "stopped":
        return 130 if interrupted else STOP_EXIT_CODE
    if isinstance(code, int):
        if code < 0:
            return 128 + (-code)
        if code > 0:
            return code if code < 256 else EXIT_FAILED
    return EXIT_FAILED


def _duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "n/a"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def progress_text(job: Dict[str, Any]) -> str:
    """One line: state, epoch, step, loss, ETA, RAM, VRAM."""
    parts = [f"[{job.get('id')}] {job.get('state')}"]
    if job.get("state") == "paused" and job.get("pause_mode"):
        parts[0] += f" ({job['pause_mode']})"
    if job.get("epochs"):
        parts.append(f"epoch {job.get('epoch') or 0}/{job['epochs']}")
    if job.get("steps"):
        parts.append(f"step {job.get('step') or 0}/{job['steps']}")
    loss = (job.get("metrics") or {}).get("loss")
    if isinstance(loss, (int, float)):
        parts.append(f"loss {loss:.4g}")
    if job.get("eta_seconds") is not None:
        parts.append(f"ETA {_duration(job['eta_seconds'])}")
    parts.append(f"RAM {format_bytes(job.get('rss_bytes'))}")
    parts.append(f"VRAM {format_bytes(job.get('vram_bytes'))}")
    return " · ".join(parts)


class Follower:
    """Shows a job's output, progress and the guard's events until it ends; Ctrl-C parks or
    stops it (twice: stops it at once)."""

    def __init__(self, client: Any, paths: Paths, job: Dict[str, Any],
                 out: Optional[TextIO] = None):
        self.client = client
        self.paths = paths
        self.job = job
        self.job_id = str(job["id"])
        self.out = out or sys.stdout
        self.tty = self.out.isatty()
        self.offset = 0
        self.pending = ""  # a partial last line, held back on a terminal
        self.pending_since = 0.0
        self.interrupts = 0
        self.handled = 0
        self.line_shown = False
        self.last_progress = 0.0
        self.last_plain = ""
        self.events: queue.Queue[Dict[str, Any]] = queue.Queue()
        self.output_seen = False
        self._stop_events = threading.Event()
        self.engine_options: Dict[str, Any] = {}  # how to start an engine if it goes away

    # -- set-up -------------------------------------------------------------------------------

    def run(self) -> int:
        _say(f"job {self.job_id} ({self.job.get('name')}) started; output follows "
             "(Ctrl-C: " + ("park" if self.job.get("checkpoint_dir") else "stop") + " it)")
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGINT, self._on_sigint)
        threading.Thread(target=self._event_reader, daemon=True).start()
        try:
            return self._loop()
        finally:
            self._stop_events.set()
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.interrupts += 1

    def _event_reader(self) -> None:
        from trayapp.engine.client import EngineUnavailable, Subscription

        while not self._stop_events.is_set():
            try:
                with Subscription(self.paths, snapshots=False, events=True) as sub:
                    while not self._stop_events.is_set():
                        msg = sub.get(0.5)
                        if msg and msg.get("push") == "event":
                            self.events.put(msg.get("data") or {})
            except EngineUnavailable:
                self._stop_events.wait(1.0)
            except Exception:  # never let the side thread end the command
                self._stop_events.wait(1.0)

    # -- the loop -----------------------------------------------------------------------------

    def _loop(self) -> int:
        from trayapp.engine.client import EngineBusy, EngineUnavailable

        last_get = 0.0
        busy_said = False
        while True:
            if self.interrupts > self.handled:
                if self._interrupt():
                    self._clear_line()
                    _say(f"left job {self.job_id}; the engine goes on ending it")
                    return 130
            try:
                drained = self._read_log()
                now = time.monotonic()
                if now - last_get >= 0.5 or self.job.get("state") not in LIVE_STATES:
                    self.job = self.client.job_get(self.job_id)
                    last_get = now
                busy_said = False
            except EngineBusy:
                # It runs, and watches the job: follow on once it answers again (Ctrl-C leaves).
                if not busy_said:
                    self._clear_line()
                    _say(f"the engine is busy and does not answer now; still following job "
                         f"{self.job_id}")
                    busy_said = True
                self.client.close()
                time.sleep(POLL_SECONDS)
                continue
            except EngineUnavailable:
                if not self._reconnect():
                    self._clear_line()
                    _say(f"the engine went away; job {self.job_id} goes on running "
                         "(see 'headroom jobs')")
                    return 3
                continue
            self._show_events()
            state = self.job.get("state")
            if state not in LIVE_STATES and drained:
                if state == "parked" and self._wait_for_auto_resume():
                    time.sleep(POLL_SECONDS)
                    continue
                return self._finish()
            self._show_progress()
            time.sleep(POLL_SECONDS)

    def _reconnect(self) -> bool:
        """The engine went away: start one (it adopts the job); False when none comes."""
        from trayapp.engine.client import EngineBusy, EngineUnavailable, connect

        try:
            self.client.close()
            self.client = connect(self.paths, start=True, **self.engine_options)
            return True
        except EngineBusy:
            return True  # one runs: the loop follows on through it
        except EngineUnavailable:
            return False

    def _wait_for_auto_resume(self) -> bool:
        """A job the guard parked and will resume by itself is followed on (until Ctrl-C)."""
        if self.handled:
            return False
        by = self.job.get("parked_by") or self.job.get("park_by")
        return by == "guard" and bool(self.job.get("auto_resume"))

    def _interrupt(self) -> bool:
        """Act on Ctrl-C; True when the command should leave now."""
        self.handled += 1
        self._clear_line()
        if self.handled == 1:
            state = self.job.get("state")
            if state == "parked":
                return True
            park = bool(self.job.get("checkpoint_dir")) and bool(self.job.get("hooked"))
            if park:
                _say(f"parking job {self.job_id} (checkpoint, then end); Ctrl-C again to stop "
                     "it at once")
            else:
                _say(f"stopping job {self.job_id}; Ctrl-C again to stop it at once")
            self._act_in_background("park" if park else "stop", fallback="stop")
            return False
        if self.handled == 2:
            _say(f"stopping job {self.job_id} at once")
            self._act_in_background("kill", fallback=None)
            return False
        return True

    def _act_in_background(self, action: str, fallback: Optional[str]) -> None:
        from trayapp.engine.client import EngineClient, EngineError, EngineUnavailable

        def act() -> None:
            with EngineClient(self.paths, timeout=10.0) as c:
                try:
                    c.job_action(self.job_id, action, reason="Ctrl-C in headroom run")
                except EngineError as e:
                    if fallback is None:
                        _say(one_line(e))
                        return
                    _say(f"{one_line(e)}; stopping it instead")
                    try:
                        c.job_action(self.job_id, fallback, reason="Ctrl-C in headroom run")
                    except (EngineError, EngineUnavailable) as e2:
                        _say(one_line(e2))
                except EngineUnavailable as e:
                    _say(one_line(e))

        threading.Thread(target=act, daemon=True).start()

    # -- output -------------------------------------------------------------------------------

    def _read_log(self) -> bool:
        """Copy new output to the terminal; True when all of the log has been read."""
        for _ in range(64):
            chunk = self.client.job_log(self.job_id, offset=self.offset)
            data = chunk.get("data") or ""
            self.offset = int(chunk.get("offset") or self.offset)
            if data:
                self._write_output(data)
            if self.offset >= int(chunk.get("size") or 0) or not data:
                break
        ended = self.job.get("state") not in LIVE_STATES
        if self.pending and (ended or time.monotonic() - self.pending_since > 1.0):
            self._write_output("", flush_partial=True)
        size_left = self.offset < int(chunk.get("size") or 0)
        return not size_left

    def _write_output(self, data: str, flush_partial: bool = False) -> None:
        text = self.pending + data
        if self.tty and not flush_partial:
            # On a terminal a partial line would be overwritten by the progress line.
            cut = text.rfind("\n") + 1
            if cut < len(text):
                if not self.pending:
                    self.pending_since = time.monotonic()
                self.pending = text[cut:]
                text = text[:cut]
            else:
                self.pending = ""
        else:
            self.pending = ""
        if not text:
            return
        self._clear_line()
        self.out.write(text)
        self.out.flush()
        self.output_seen = True

    def _clear_line(self) -> None:
        if self.tty and self.line_shown:
            self.out.write("\r\x1b[K")
            self.out.flush()
            self.line_shown = False

    def _show_progress(self) -> None:
        now = time.monotonic()
        text = progress_text(self.job)
        if self.tty:
            if now - self.last_progress < PROGRESS_TTY_SECONDS and self.line_shown:
                return
            self.last_progress = now
            width = _terminal_width()
            self.out.write("\r\x1b[K" + text[: max(10, width - 1)])
            self.out.flush()
            self.line_shown = True
            return
        # Plain output: a line when the training position or the state moved, every 2 s at most.
        key = f"{self.job.get('state')} {self.job.get('epoch')} {self.job.get('step')}"
        if key == self.last_plain or now - self.last_progress < PROGRESS_PLAIN_SECONDS:
            return
        if self.job.get("state") in ("starting", "running") and not self.job.get("epochs"):
            return  # no training progress to tell (a script without fit)
        self.last_plain = key
        self.last_progress = now
        print(f"headroom: {text}", file=sys.stderr, flush=True)

    def _show_events(self) -> None:
        while True:
            try:
                ev = self.events.get_nowait()
            except queue.Empty:
                return
            if not self._worth_showing(ev):
                continue
            self._clear_line()
            level = ev.get("level")
            mark = "! " if level in ("warn", "error") else ""
            _say(f"{mark}{ev.get('message')}")

    def _worth_showing(self, ev: Dict[str, Any]) -> bool:
        """The guard's events about this job, its runner's warnings, and pauses or resumes
        that someone else asked for (the summary at the end tells how it ended)."""
        data = ev.get("data")
        data = data if isinstance(data, dict) else {}
        if ev.get("job_id") != self.job_id and self.job_id not in (data.get("job_ids") or []):
            return False
        kind = str(ev.get("kind") or "")
        if kind.startswith("guard"):
            return True
        if kind == "job_note":
            return ev.get("level") in ("warn", "error")
        if kind in ("job_paused", "job_resumed"):
            return data.get("by") != "guard"  # the guard's own event says it already
        return kind not in ("job_started", "job_finished", "job_failed", "job_stopped",
                            "job_parked", "job_lost", "job_adopted")

    def _finish(self) -> int:
        self._clear_line()
        self._show_events()
        job = self.job
        state = job.get("state")
        interrupted = self.handled > 0
        status = _exit_status(job, interrupted)
        if state == "finished":
            _say(f"job {self.job_id} finished")
        elif state == "parked":
            where = job.get("checkpoint_dir")
            _say(f"job {self.job_id} parked (checkpoint in {where}); continue it with "
                 f"'headroom resume {self.job_id}'")
        elif state == "stopped":
            text = f"job {self.job_id} {job.get('end_reason') or 'stopped'}"
            if job.get("resumable"):
                text += (f" (checkpoint in {job.get('checkpoint_dir')}); continue it with "
                         f"'headroom resume {self.job_id}'")
            _say(text)
        elif state == "lost":
            _say(f"job {self.job_id}: {job.get('end_reason') or 'its end is unknown'}")
        else:
            _say(f"job {self.job_id} failed ({job.get('end_reason') or 'exit status unknown'})")
            if not self.tty or not self.output_seen:
                self._print_last_lines()
        return status

    def _print_last_lines(self) -> None:
        try:
            chunk = self.client.job_log(self.job_id, offset=None)
        except Exception:
            return
        lines = (chunk.get("data") or "").rstrip("\n").splitlines()[-LAST_LINES:]
        if lines:
            print(f"headroom: the last lines of its output ({self.job.get('log_path')}):",
                  file=sys.stderr)
            for line in lines:
                print(f"  {line}", file=sys.stderr)
            sys.stderr.flush()


def _terminal_width() -> int:
    import shutil

    columns = shutil.get_terminal_size((100, 24)).columns
    return columns if columns >= 20 else 100  # a pseudo-terminal may say 0


# -- jobs -----------------------------------------------------------------------------------------


def _started(t: Optional[float]) -> str:
    if not t:
        return "n/a"
    now = time.time()
    if now - t < 20 * 3600:
        return time.strftime("%H:%M:%S", time.localtime(t))
    return time.strftime("%b %d %H:%M", time.localtime(t))


def _progress_cell(job: Dict[str, Any]) -> str:
    parts = []
    if job.get("epochs"):
        parts.append(f"epoch {job.get('epoch') or 0}/{job['epochs']}")
    if job.get("steps"):
        parts.append(f"step {job.get('step') or 0}/{job['steps']}")
    if job.get("state") not in LIVE_STATES and job.get("exit_code") is not None:
        parts.append(f"exit {job['exit_code']}")
    return ", ".join(parts) or "-"


def format_jobs(jobs: List[Dict[str, Any]]) -> str:
    """The jobs as a table: id, name, state, progress, RAM, VRAM, started."""
    if not jobs:
        return "no jobs"
    head = ("ID", "NAME", "STATE", "PROGRESS", "RAM", "VRAM", "STARTED")
    rows = [head]
    for j in jobs:
        state = str(j.get("state"))
        if state == "paused" and j.get("pause_mode"):
            state += f" ({j['pause_mode']})"
        rows.append((str(j.get("id")), str(j.get("name") or "")[:24], state, _progress_cell(j),
                     format_bytes(j.get("rss_bytes")), format_bytes(j.get("vram_bytes")),
                     _started(j.get("started"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def cmd_jobs(args: argparse.Namespace, paths: Paths) -> int:
    from trayapp.engine.client import connect

    # An engine is started when state exists: it adopts jobs left running and knows the parked.
    client = connect(paths, start=paths.db_file.exists(), demo=bool(getattr(args, "demo", False)),
                     config_file=getattr(args, "config", None))
    try:
        jobs = client.jobs(all=bool(args.all))
    finally:
        client.close()
    if args.json:
        print(json.dumps(jobs, indent=None))
    elif not jobs and not args.all:
        # Where a job that just ended went, a stopped one that 'headroom resume' continues too.
        print("no running, paused or parked jobs ('headroom jobs --all' lists the ended ones, "
              "stopped included)")
    else:
        print(format_jobs(jobs))
    return EXIT_OK


# -- pause, resume, park, stop ------------------------------------------------------------------


def describe(job: Dict[str, Any]) -> str:
    """One line: the job and its state now."""
    state = str(job.get("state"))
    extra = ""
    if state == "paused" and job.get("pause_mode"):
        extra = f" ({job['pause_mode']})"
    elif state in ("failed", "stopped", "lost", "parked") and job.get("end_reason"):
        extra = f" ({job['end_reason']})"
    return f"job {job.get('id')} ({job.get('name')}): {state}{extra}"


def cmd_action(args: argparse.Namespace, paths: Paths) -> int:
    from trayapp.engine.client import connect

    # Resuming a parked job needs an engine to launch it; the others act on a running one.
    start = args.command == "resume" and paths.db_file.exists()
    client = connect(paths, start=start, demo=bool(getattr(args, "demo", False)),
                     config_file=getattr(args, "config", None))
    try:
        job = client.job_action(args.job, args.command)
    finally:
        client.close()
    print(describe(job))
    return EXIT_OK


# -- doctor -------------------------------------------------------------------------------------


def _gpu_readings(status: Dict[str, Any]) -> Tuple[Any, tuple]:
    """(GpuStatus, GpuReadings) from a status object's JSON."""
    from dataclasses import fields

    from trayapp.probes.snapshot import GpuProcess, GpuReading, GpuStatus

    def build(cls: Any, data: Dict[str, Any]) -> Any:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    gpu_status = build(GpuStatus, status.get("gpu_status") or {"backend": "none"})
    gpus = []
    for g in status.get("gpus") or []:
        g = dict(g)
        g["processes"] = tuple(build(GpuProcess, p) for p in g.get("processes") or [])
        gpus.append(build(GpuReading, g))
    return gpu_status, tuple(gpus)


def _machine_gpus(paths: Paths, demo: bool) -> Tuple[Any, tuple]:
    """The GPU status from the engine when one runs, else read from the probes now."""
    from trayapp.engine.client import EngineClient, EngineUnavailable

    try:
        with EngineClient(paths, timeout=5.0) as client:
            return _gpu_readings(client.status())
    except EngineUnavailable:
        pass
    from trayapp.probes.gpu import make_backend

    backend = make_backend(demo=demo)
    try:
        return backend.status, tuple(backend.read())
    finally:
        backend.close()


def cmd_doctor(args: argparse.Namespace, paths: Paths) -> int:
    from trayapp.jobs import doctor, interpreters

    python = args.python
    if python:
        from trayapp.jobs.options import SpecError, resolve_python

        try:
            python = os.path.abspath(resolve_python(python))
        except SpecError as e:
            raise UsageError(one_line(e)) from None
        if not os.path.exists(python):
            raise UsageError(f"--python: not found: {python}")
    else:
        # As for a script in this folder: a venv here (or just above), else this Python.
        python = interpreters.default_python(os.path.join(os.getcwd(), "script.py"))
    gpu_status, gpus = _machine_gpus(paths, bool(getattr(args, "demo", False)))
    interp = interpreters.probe(python, cache_dir=paths.data_dir / "cache")
    checks = doctor.diagnose(interp, gpu_status, gpus)
    if args.json:
        print(json.dumps({"python": interp.to_json(), "verdict": doctor.verdict(checks),
                          "checks": [c.to_json() for c in checks]}))
    else:
        print(doctor.format_report(checks), end="")
    return EXIT_FAILED if doctor.verdict(checks) == "fail" else EXIT_OK


__all__ = ["dispatch", "Follower", "format_jobs", "progress_text", "describe", "EXIT_USAGE"]
