"""Start, watch, pause, resume, park and stop training jobs (whole process trees); their logs.

Every job runs in its own session (process group), with stdout and stderr in
``jobs/<id>/log``, and talks to the engine over its own channel (``paths.job_address(id)``,
authenticated with a key kept in ``jobs/<id>/key``, 0600). The runner inside the job is the
channel's client; it reconnects when the engine comes back, so an engine that restarts takes
its jobs back (``adopt``). An engine that goes away never ends a job.

Threads: the engine loop calls ``tick``; control-channel threads call the actions; each job's
channel has threads of its own. One lock guards every job's state. No action blocks: stop
escalation, pause deadlines and reaping all advance in ``tick``.

A parked job that is resumed is relaunched under the same id (same folder, log and channel,
``runs`` counts the launches) with its spec's ``resume`` set, so the runner continues from the
checkpoint. So is a stopped job that has a checkpoint folder: the runner's stop saves where
training is, ends ``fit()`` and exits with ``STOP_EXIT_CODE`` before the rest of the script.
"""

from __future__ import annotations

import copy
import dataclasses
import errno
import json
import logging
import os
import secrets
import signal
import stat
import subprocess
import sys
import threading
import time
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import psutil

from trayapp import config as configmod
from trayapp import private, vocab
from trayapp.channel import ChannelServer, Peer
from trayapp.config import Paths
from trayapp.jobs import envfile, messages
from trayapp.jobs.logcap import LogKeeper
from trayapp.probes.snapshot import GpuReading, Snapshot
from trayapp.runner import joblog
from trayapp.runner import protocol as rp
from trayapp.text import one_line
from trayapp.vocab import JobState as S

log = logging.getLogger("headroom.jobs")

WINDOWS = sys.platform == "win32"

# A job in one of these states has (or had, a moment ago) a process.
LIVE_STATES = vocab.LIVE
# Transitional states: an action is under way.
BUSY_STATES = vocab.BUSY
END_STATES = vocab.ENDED
STATES = vocab.ALL

ACTIONS = ("pause", "resume", "park", "stop", "kill")

SAMPLE_INTERVAL = 0.25  # psutil reads a job's tree at most 4 times a second
SAVE_INTERVAL = 5.0  # progress reaches the store at most this often (state changes at once)
LOG_TAIL_BYTES = 64 * 1024
# Logs go back as JSON with non-ASCII escaped (up to 6 bytes a byte): stay under the 1 MiB limit.
LOG_MAX_BYTES = 128 * 1024
MAX_NOTES = 50
# Warnings and errors a job sends become events (database rows kept for days, log lines): at
# most this many a minute per job; the rest are kept with the job only.
NOTE_EVENTS_PER_MINUTE = 20
RECENT_ENDED = 50

# Stop escalation, seconds spent at each step before the next one.
# The runner's own stop checkpoints, ends fit() at the next batch and exits; a runner that
# answers "stopping" (a fit() runs) gets the longer time to reach the batch and save, unless the
# guard asked (its last resort when memory runs out).
STOP_ASK_SECONDS = 5.0
STOP_RUNNER_SECONDS = 60.0
STOP_INT_SECONDS = 3.0  # SIGINT (CTRL_BREAK_EVENT on Windows)
STOP_TERM_SECONDS = 3.0  # SIGTERM; then SIGKILL
KILL_WAIT_SECONDS = 5.0  # after SIGKILL, how long to wait for the tree to vanish

Emit = Callable[..., Any]
# An event to emit once the lock is released: (kind, level, message, job id, data).
_Event = Tuple[str, str, str, Optional[str], Optional[Dict[str, Any]]]


class _Job:
    """One job's state: the public dict (``info``) and what only the manager holds."""

    def __init__(self, info: Dict[str, Any], key: bytes):
        self.info = info
        self.key = key
        self.popen: Optional[subprocess.Popen] = None  # our own child
        self.process: Optional[psutil.Process] = None  # the root, ours or adopted
        self.server: Optional[ChannelServer] = None
        self.peer: Optional[Peer] = None
        # Every process seen in the tree, so remnants reparented away are still found.
        self.known: Dict[int, psutil.Process] = {}
        self.next_sample = 0.0
        self.last_saved = 0.0
        self.dirty = False
        self.pause_deadline: Optional[float] = None  # monotonic
        self.stop_stage = 0  # 0 none, 1 asked the runner, 2 SIGINT, 3 SIGTERM, 4 SIGKILL
        self.stop_next = 0.0  # monotonic time of the next stop step
        self.stop_grace = False  # the runner's "stopping" got its time to save (once a stop)
        self.stop_note: Tuple[str, str] = ("user", "")
        self.park_note: Tuple[str, str] = ("user", "")
        self.rate_ref: Optional[Tuple[float, float]] = None  # (time, progress units)
        self.exit_seen = False
        self.meter: Any = None  # the tree's TreeMeter (pages counted once), made on first use
        self.note_window = (-60.0, 0)  # (monotonic start of the minute, note events in it)

    @property
    def id(self) -> str:
        return str(self.info["id"])

    @property
    def state(self) -> str:
        return str(self.info["state"])


def _move(info: Dict[str, Any], new: str) -> None:
    """Set a job's state; a change the vocabulary's table does not have is logged (the state
    is set all the same)."""
    old = info.get("state")
    if not vocab.can_move(old, new):
        log.warning("job %s: unexpected state change %s -> %s", info.get("id"), old, new)
    info["state"] = str(new)


def _job_environ(folder: Path) -> Dict[str, str]:
    """The environment a job starts from: its client's, kept at start, else the engine's."""
    environ, _ = envfile.load(folder)
    return environ if environ is not None else dict(os.environ)


def _now() -> float:
    return time.time()


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


def _refused_on_disk_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A start whose files cannot be written (disk full, read-only, quota) is refused with the
    reason in one line, and leaves no half-made job folder behind."""
    import functools

    @functools.wraps(fn)
    def wrapper(self: JobManager, *args: Any, **kwargs: Any) -> Any:
        before = _folders(self.paths.jobs_dir)
        try:
            return fn(self, *args, **kwargs)
        except OSError as e:
            with self._lock:
                known = set(self._jobs) | set(self._ended)
            for name in _folders(self.paths.jobs_dir) - before - known:
                _remove_folder(self.paths.jobs_dir / name)
            raise ValueError(f"cannot start the job: {(e.strerror or one_line(e)).lower()} "
                             f"under {self.paths.jobs_dir}") from None

    return wrapper


def _folders(folder: Path) -> Set[str]:
    try:
        return {p.name for p in folder.iterdir()}
    except OSError:
        return set()


class JobManager:
    """The engine's jobs. See the module docstring for threads and life cycle.

    ``emit(kind, message, *, level, job_id, data)`` records and pushes an event; ``gpus()``
    returns the engine's latest GPU readings; ``config()`` its current settings.
    """

    def __init__(self, paths: Paths, store: Any, *, emit: Emit,
                 gpus: Callable[[], Iterable[GpuReading]] = lambda: (),
                 config: Callable[[], Any] = lambda: configmod.Config(),
                 runner_dir: Optional[Path] = None, subreaper: bool = True):
        self.paths = paths
        self.store = store
        self._emit = emit
        self._gpus = gpus
        self._config = config
        self.runner_dir = runner_dir  # None: the plan's default (also right in a frozen build)
        self._lock = threading.RLock()
        self._jobs: OrderedDict[str, _Job] = OrderedDict()
        self._ended: OrderedDict[str, Dict[str, Any]] = OrderedDict()
        self._closed = False
        # Orphans of job trees left after their job ended, reaped as they exit.
        self._orphans: Dict[int, psutil.Process] = {}
        self._orphans_checked = 0.0
        # The process groups of the jobs this process started (a job's root leads its own
        # session and group): what in them dies as our child, the subreaper's, is reaped even
        # if it was never seen in a sample (a worker forked and killed between two samples).
        self._groups: Set[int] = set()
        self._memory_total: Optional[int] = None  # from the engine's latest reading
        self._drops = messages.DropLog()  # what jobs sent that was not taken, per job
        self.subreaper = become_subreaper() if subreaper else False
        # Each running job's log is kept under its cap (jobs.log_max_mb) by its own thread.
        self._log_keeper = LogKeeper(self._running_logs)
        self._log_keeper.start()

    # -- the engine's calls -------------------------------------------------------------------

    def handlers(self) -> Dict[str, Callable[[Peer, Dict[str, Any]], Any]]:
        """The control-channel ops this manager answers: ``{op: fn(peer, args)}``."""
        return {
            "jobs": lambda peer, a: self.list(include_finished=bool(a.get("all"))),
            "job_get": lambda peer, a: self.get(a["job"]),
            "job_start": lambda peer, a: self.start(a["spec"], environ=a.get("environ"),
                                                    env_from=a.get("env_from")),
            "job_action": self._op_action,
            "job_log": lambda peer, a: self.log(a["job"], a.get("offset"), a.get("max_bytes")),
            "jobs_pause_all": lambda peer, a: self.pause_all(by="user"),
        }

    def list(self, include_finished: bool = False) -> List[Dict[str, Any]]:
        """Job dicts, newest first: live and parked jobs, and with ``include_finished`` the
        ended ones the store keeps."""
        with self._lock:
            out = {j.id: self._public(j) for j in self._jobs.values()}
            recent = {k: copy.deepcopy(v) for k, v in self._ended.items()}
        if include_finished:
            for job in self.store.list_jobs(include_finished=True, limit=200):
                if isinstance(job, dict) and job.get("id") not in out:
                    out[str(job["id"])] = job
            for k, v in recent.items():
                if k not in out or out[k].get("state") in LIVE_STATES:
                    out[k] = v
        return sorted(out.values(), key=lambda j: -(j.get("started") or 0))

    def guard_jobs(self) -> List[Dict[str, Any]]:
        """What the guard's ladder reads of each live or parked job: only fields the engine
        keeps itself (state, pids, memory, budgets, who paused it), never a job's messages, so
        nothing a job sends can make this fail. A record that cannot be read is left out (and
        logged); the others still come back."""
        out = []
        with self._lock:
            for job in list(self._jobs.values()):
                try:
                    out.append(_guard_fields(job.info))
                except Exception:  # pragma: no cover - the fields are the engine's own
                    log.exception("job %s: its record cannot be read", job.id)
        return out

    def active_count(self) -> int:
        """Jobs with a process (parked ones have none)."""
        with self._lock:
            return sum(1 for j in self._jobs.values() if j.state in LIVE_STATES)

    def get(self, job_ref: str) -> Dict[str, Any]:
        """The job dict for an id, a unique id prefix or a unique name.

        Raises LookupError ("no job named x" / "x matches 2 jobs (...)")."""
        with self._lock:
            job = self._find(job_ref)
            if isinstance(job, _Job):
                return self._public(job)
            return copy.deepcopy(job)

    # -- starting -----------------------------------------------------------------------------

    @_refused_on_disk_errors
    def start(self, spec_json: Dict[str, Any],
              environ: Optional[Dict[str, Any]] = None,
              env_from: Optional[str] = None) -> Dict[str, Any]:
        """Validate the spec and launch it. Returns the new job's dict (state "starting").

        ``environ``: the environment of the client that asked (``headroom run`` in a shell), so
        the job sees what ``python script.py`` in that shell would; the engine's own otherwise.
        ``env_from``: a job whose kept ``--env`` values fill the spec's hidden ones (a job's
        spec as shown has its ``env`` values hidden; see ``envfile``).
        Raises ValueError with one line for a bad spec or a launch that fails (no job is
        recorded then)."""
        from trayapp.jobs.options import JobSpec, SpecError, validate

        if self._closed:
            raise ValueError("the engine is shutting down")
        _check_free_space(self.paths.jobs_dir)
        if environ is not None and not all(isinstance(k, str) and isinstance(v, str)
                                           for k, v in environ.items()):
            raise ValueError("job_start: environ must map names to strings")
        if envfile.hidden_names(spec_json if isinstance(spec_json, dict) else {}):
            spec_json = envfile.restore(spec_json, self._env_folder(env_from))
        try:
            spec = JobSpec.from_json(spec_json)
            spec_warnings = list(validate(spec, tuple(self._gpus()), check_paths=True))
            applied = self._with_preset(spec)
        except SpecError as e:
            raise ValueError(one_line(e)) from None
        with self._lock:
            job_id = self._new_id()
            folder = self.paths.jobs_dir / job_id
            folder.mkdir(parents=True, exist_ok=False, mode=0o700)
            key = secrets.token_bytes(32)
            configmod.atomic_write_bytes(folder / "key", key, mode=0o600)
            # The spec as kept and shown names its --env variables without their values; those
            # (and the shell's environment) are kept for a relaunch in one private file.
            spec_data = envfile.hide(spec.to_json())
            configmod.atomic_write(folder / "spec.json", json.dumps(spec_data, indent=2) + "\n")
            envfile.save(folder, environ, spec.env)
            info = self._new_info(job_id, applied, spec_data, folder, spec_warnings)
            job = _Job(info, key)
            try:
                self._open_channel(job)
                self._launch(job, applied, append=False)
            except ValueError:
                self._close_channel(job)
                _remove_folder(folder)
                raise
            self._jobs[job_id] = job
            self._save(job)
            job_info = self._public(job)
        where = f" in {info['cwd']}" if info.get("cwd") else ""
        self._emit("job_started", f"job {job_id} ({info['name']}) started{where} "
                   f"(pid {info['pid']})", job_id=job_id,
                   data={"pid": info["pid"], "argv": info["argv"], "warnings": spec_warnings})
        return job_info

    def _env_folder(self, env_from: Optional[str]) -> Optional[Path]:
        """The folder of the job ``env_from`` names (None: no such job, or none named)."""
        if not isinstance(env_from, str) or not env_from:
            return None
        with self._lock:
            try:
                job = self._find(env_from)
            except LookupError:
                return None
        info = job.info if isinstance(job, _Job) else job
        return self.paths.jobs_dir / str(info["id"])

    def _with_preset(self, spec: Any) -> Any:
        """The spec with its preset applied against this machine (GPUs, RAM total), so the
        job's budgets are known here; the stored spec keeps what the user asked for."""
        from trayapp.jobs.options import apply_preset

        if not getattr(spec, "preset", None):
            return spec
        total = self._memory_total or psutil.virtual_memory().total
        return apply_preset(spec, spec.preset, tuple(self._gpus()), ram_total_bytes=total)

    def _new_id(self) -> str:
        for _ in range(100):
            job_id = secrets.token_hex(4)
            if job_id in self._jobs or job_id in self._ended:
                continue
            if (self.paths.jobs_dir / job_id).exists() or self.store.get_job(job_id) is not None:
                continue
            return job_id
        raise ValueError("cannot find a free job id")  # pragma: no cover - 2**32 ids

    def _new_info(self, job_id: str, spec: Any, spec_data: Dict[str, Any], folder: Path,
                  warnings: List[str]) -> Dict[str, Any]:
        name = getattr(spec, "name", None) or Path(str(getattr(spec, "script", "job"))).stem
        ckpt = getattr(spec, "checkpoint_dir", None)
        auto = getattr(spec, "auto_resume", None)
        if auto is None:
            auto = bool(self._setting("guard.auto_resume", True))
        return {
            "id": job_id, "name": name, "state": "starting",
            "pid": None, "pids": [], "create_time": None,
            "rss_bytes": None, "vram_bytes": None,
            "epoch": None, "epochs": None, "step": None, "steps": None,
            "metrics": {}, "eta_seconds": None, "tf_memory": None,
            "started": _now(), "ended": None, "end_reason": None, "exit_code": None,
            "hooked": False, "connected": False, "hello": None, "bye": None,
            "spec": spec_data, "script": str(getattr(spec, "script", "")),
            "cwd": None, "argv": [],
            "checkpoint_dir": str(ckpt) if ckpt else None, "checkpoint": None,
            "log_path": str(folder / "log"),
            "paused_by": None, "pause_reason": None, "pause_mode": None, "paused_at": None,
            "ram_budget_bytes": _budget(spec, "ram_budget"),
            "vram_budget_bytes": _budget(spec, "vram_budget"),
            "auto_resume": bool(auto), "notes": [], "warnings": list(warnings),
            "runs": 0, "resumed_at": None,
        }

    def _open_channel(self, job: _Job) -> None:
        address = self.paths.job_address(job.id)
        job_id = job.id
        server = ChannelServer(
            address, job.key, lambda peer, data: self._on_message(job_id, peer, data),
            name=f"job-{job_id}", max_peers=4,
            on_close=lambda peer: self._on_disconnect(job_id, peer))
        try:
            server.start()
        except OSError as e:
            raise ValueError(f"cannot open the job's channel at {address}: "
                             f"{e.strerror or e}") from None
        job.server = server

    def _close_channel(self, job: _Job) -> None:
        if job.server is not None:
            job.server.close()
            job.server = None
        job.peer = None
        job.info["connected"] = False

    def _launch(self, job: _Job, spec: Any, *, append: bool) -> None:
        """Build the plan and start the process in its own session, output to the log."""
        from trayapp.jobs.plan import JobProcess, build_launch

        folder = self.paths.jobs_dir / job.id
        log_path = Path(job.info["log_path"])
        process = JobProcess.from_config(self._config())
        try:
            plan = build_launch(spec, job_id=job.id, address=self.paths.job_address(job.id),
                                keyfile=str(folder / "key"), gpus=tuple(self._gpus()),
                                base_env=_job_environ(folder), runner_dir=self.runner_dir,
                                process=process, log_path=str(log_path))
        except Exception as e:  # SpecError and friends: a plan that cannot be made
            raise ValueError(one_line(e)) from None
        kwargs: Dict[str, Any] = {}
        if WINDOWS:  # pragma: no cover - Windows only
            kwargs["creationflags"] = (subprocess.CREATE_NEW_PROCESS_GROUP  # type: ignore
                                       | subprocess.CREATE_NO_WINDOW  # type: ignore
                                       | (subprocess.BELOW_NORMAL_PRIORITY_CLASS  # type: ignore
                                          if process.nice > 0 else 0))
        else:
            kwargs["start_new_session"] = True
            if private.user_umask() is not None:
                kwargs["umask"] = private.user_umask()  # the user's, not the engine's 077
        with _open_job_log(log_path) as out:
            if append:
                try:
                    out.write(f"\n--- resumed from checkpoint "
                              f"{time.strftime('%Y-%m-%d %H:%M:%S')} ---\n".encode())
                    out.flush()
                except OSError:
                    pass  # a full disk costs the log this line, not the job its relaunch
            try:
                popen = subprocess.Popen(list(plan.argv), env=dict(plan.env), cwd=plan.cwd,
                                         stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, close_fds=True, **kwargs)
            except OSError as e:
                raise ValueError(f"cannot start {plan.argv[0]}: "
                                 f"{e.strerror or one_line(e)}") from None
        job.popen = popen
        job.info["process"] = {"nice": process.nice, "oom_score_adj": process.oom_score_adj,
                               "log_max_bytes": process.log_max_bytes}
        if not WINDOWS:
            self._groups.add(popen.pid)
        try:
            job.process = psutil.Process(popen.pid)
            create_time: Optional[float] = job.process.create_time()
        except psutil.Error:
            job.process, create_time = None, None
        info = job.info
        _move(info, S.STARTING)
        info.update(pid=popen.pid, pids=[popen.pid], create_time=create_time,
                    argv=list(plan.argv), cwd=str(plan.cwd) if plan.cwd else None,
                    exit_code=None, ended=None, end_reason=None, bye=None, hooked=False,
                    runs=int(info.get("runs") or 0) + 1, eta_seconds=None, resumable=False,
                    paused_by=None, pause_reason=None, pause_mode=None, paused_at=None)
        for w in getattr(plan, "warnings", ()) or ():
            if w not in info["warnings"]:
                info["warnings"].append(w)
        job.known = {popen.pid: job.process} if job.process is not None else {}
        job.exit_seen = False
        job.meter = None  # a new tree
        job.stop_stage = 0
        job.pause_deadline = None
        job.rate_ref = None
        job.next_sample = 0.0

    # -- adoption -----------------------------------------------------------------------------

    def adopt(self) -> List[str]:
        """Take back the jobs an earlier engine left: live ones get their channel back (same
        address, same key) and are watched with psutil; parked ones wait for ``resume``; the
        rest end as "lost", or as the runner's ``bye`` said. Returns the adopted ids."""
        adopted: List[str] = []
        for saved in self.store.list_jobs(include_finished=False, limit=1000):
            if not isinstance(saved, dict) or not saved.get("id"):
                continue
            job_id = str(saved["id"])
            with self._lock:
                if job_id in self._jobs:
                    continue
                try:
                    key = (self.paths.jobs_dir / job_id / "key").read_bytes()
                except OSError:
                    key = b""
                reset = messages.clean_record(saved)
                if reset:
                    log.warning("job %s: its saved %s did not pass the checks; reset", job_id,
                                ", ".join(reset))
                job = _Job(saved, key)
                state = job.state
                if state == "parked":
                    self._jobs[job_id] = job
                    continue
                if state not in LIVE_STATES:
                    continue
                proc = _same_process(saved.get("pid"), saved.get("create_time"))
                if proc is None:
                    self._end(job, None, adopted_gone=True)
                    continue
                job.process = proc
                job.known = {proc.pid: proc}
                job.info["connected"] = False
                try:
                    if not key:
                        raise ValueError("its key is missing")
                    self._open_channel(job)
                except ValueError as e:
                    log.warning("job %s: %s; it runs on without progress reports", job_id, e)
                self._jobs[job_id] = job
                if state == "pausing":
                    job.pause_deadline = time.monotonic() + self._pause_deadline(None)
                elif state == "stopping":
                    job.stop_note = (job.info.get("stop_by") or "user",
                                     job.info.get("stop_reason") or "")
                    self._stop_step(job, 2)
                adopted.append(job_id)
            self._emit("job_adopted", f"job {job_id} ({saved.get('name')}) is watched again "
                       f"(pid {saved.get('pid')}, {state})", job_id=job_id)
        return adopted

    # -- the channel --------------------------------------------------------------------------

    def _on_message(self, job_id: str, peer: Peer, data: bytes) -> None:
        # Parsed before anything is kept: a job's script can send anything on this channel.
        msg: Optional[messages.JobMessage]
        try:
            msg, dropped = messages.parse(data)
        except rp.ProtocolError as e:
            msg, dropped = None, [f"a message: {one_line(e, 200)}"]
        events: List[_Event] = []
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return None
            if msg is not None:
                try:
                    self._dispatch(job, peer, msg, events)
                except Exception:  # a bad message must never cost the job its channel
                    if not self._drops.count(job_id):
                        log.exception("job %s: handling a message failed", job_id)
                    dropped.append(f"{type(msg).__name__.lower()}: handling it failed")
            if dropped:
                self._note_dropped(job, dropped, events)
        self._flush_events(events)
        return None

    def _note_dropped(self, job: _Job, dropped: List[str], events: List[_Event]) -> None:
        """Count what was dropped from a job's messages; say so the first time, then at most
        once a minute (the log and the job's events)."""
        due = self._drops.add(job.id, len(dropped))
        job.info["dropped_fields"] = self._drops.count(job.id)
        job.dirty = True
        if due is None:
            return
        first, since = due
        text = messages.summary(dropped)
        if first:
            message = f"job {job.id}: dropped what its messages held that Headroom does not " \
                      f"take ({text})"
        else:
            message = f"job {job.id}: {since} more dropped from its messages (last: {text})"
        events.append(("job_bad_message", "warn", message, job.id, {"dropped": since}))

    def _dispatch(self, job: _Job, peer: Peer, msg: messages.JobMessage,
                  events: List[_Event]) -> None:
        if isinstance(msg, messages.Hello):
            self._on_hello(job, peer, msg, events)
        elif isinstance(msg, messages.Progress):
            self._on_progress(job, msg)
        elif isinstance(msg, messages.State):
            self._on_state(job, msg, events)
        elif isinstance(msg, messages.Checkpointed):
            if msg.path is not None:
                job.info["checkpoint"] = {"path": msg.path, "epoch": msg.epoch, "step": msg.step,
                                          "time": _now()}
                self._save(job)
        elif isinstance(msg, messages.Note):
            self._on_note(job, msg, events)
        elif isinstance(msg, messages.Bye):
            job.info["bye"] = msg.to_json()
            self._save(job)

    def _on_hello(self, job: _Job, peer: Peer, msg: messages.Hello,
                  events: List[_Event]) -> None:
        if job.peer is not None and job.peer is not peer:
            job.peer.close()
        job.peer = peer
        peer.context["job"] = job.id
        info = job.info
        info["hello"] = msg.to_json()
        # "installed": keras.Model.fit is patched, so pause, park and stop land at a batch end.
        info["hooked"] = msg.fit_hook == "installed" or bool(msg.hooked)
        info["connected"] = True
        if info["state"] == "starting":
            _move(info, S.RUNNING)
        runner_state = msg.state
        if runner_state == "paused" and info["state"] in ("running", "pausing"):
            self._set_paused(job, info.get("paused_by") or "user", info.get("pause_reason") or "",
                             "cooperative", events)
        # A command given while the runner was away is given again now it is back.
        elif info["state"] == "pausing":
            self._send(job, rp.PAUSE)
        elif info["state"] == "parking":
            self._send(job, rp.PARK)
        elif info["state"] == "stopping" and job.stop_stage == 1:
            self._send(job, rp.STOP)
        elif info["state"] == "paused" and info.get("pause_mode") == "cooperative" \
                and runner_state == "running":
            _move(info, S.RUNNING)
            info.update(pause_mode=None, paused_by=None, pause_reason=None)
        self._save(job)

    def _on_progress(self, job: _Job, msg: messages.Progress) -> None:
        info = job.info
        for field in ("epoch", "epochs", "step", "steps"):
            if field in msg.given:
                info[field] = getattr(msg, field)
        if "logs" in msg.given:
            info["metrics"] = dict(msg.logs)
        if "tf_memory" in msg.given:
            info["tf_memory"] = None if msg.tf_memory is None else \
                [m.to_json() for m in msg.tf_memory]
        if info["state"] == "starting":
            _move(info, S.RUNNING)
        self._update_eta(job)
        job.dirty = True

    def _on_state(self, job: _Job, msg: messages.State, events: List[_Event]) -> None:
        info = job.info
        state = msg.state
        if state is None:
            return  # dropped: not a state the runner has
        if state == "paused":
            # The runner pauses only when asked; after a resume a late "paused" is followed by
            # "running" as soon as the resume arrives, so only a pause under way counts.
            if info["state"] == "pausing":
                self._set_paused(job, info.get("paused_by") or "user",
                                 info.get("pause_reason") or "", "cooperative", events)
        elif state == "running":
            if info["state"] == "paused" and info.get("pause_mode") == "cooperative":
                # The runner resumed on its own (or on our word): it is running again.
                _move(info, S.RUNNING)
                info.update(pause_mode=None, paused_at=None)
                job.rate_ref = None
                self._save(job)
            elif info["state"] == "starting":
                _move(info, S.RUNNING)
                self._save(job)
        elif state == "parking" and info["state"] in ("running", "pausing", "paused"):
            _move(info, S.PARKING)
            self._save(job)
        elif state == "stopping" and info["state"] == "stopping" and job.stop_stage == 1 \
                and job.stop_note[0] != "guard":
            # The runner ends its fit() at the next batch, after a checkpoint: no signal yet.
            # (The guard's stop is its last resort when memory runs out: it does not wait.)
            # Once: a runner that says it again and again must not put the signals off for good.
            if not job.stop_grace:
                job.stop_grace = True
                job.stop_next = max(job.stop_next, time.monotonic() + STOP_RUNNER_SECONDS)
        info["runner_state"] = state

    def _on_note(self, job: _Job, msg: messages.Note, events: List[_Event]) -> None:
        level, text = msg.level, msg.message  # one line, control characters escaped
        notes = job.info.setdefault("notes", [])
        notes.append({"time": _now(), "level": level, "message": text})
        del notes[:-MAX_NOTES]
        job.dirty = True
        # Info notes ("no fit() seen") stay with the job; warnings and errors are events too.
        if level != "info":
            now = time.monotonic()
            start, count = job.note_window
            if now - start >= 60.0:
                start, count = now, 0
            count += 1
            job.note_window = (start, count)
            if count <= NOTE_EVENTS_PER_MINUTE:
                events.append(("job_note", str(level), f"job {job.id}: {text}", job.id, None))
            if count == NOTE_EVENTS_PER_MINUTE:
                events.append(("job_note", "warn", f"job {job.id} sends more than "
                               f"{NOTE_EVENTS_PER_MINUTE} warnings a minute; the rest of this "
                               "minute's are kept with the job only (headroom jobs --json)",
                               job.id, None))

    def _on_disconnect(self, job_id: str, peer: Peer) -> None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None and job.peer is peer:
                job.peer = None
                job.info["connected"] = False
                job.dirty = True

    def _send(self, job: _Job, kind: str, **fields: Any) -> bool:
        peer = job.peer
        if peer is None or peer.closed:
            return False
        return peer.send(rp.make(kind, **fields))

    # -- progress and memory ------------------------------------------------------------------

    def _update_eta(self, job: _Job) -> None:
        info = job.info
        done, total = _progress_units(info)
        if done is None or total is None:
            info["eta_seconds"] = None
            return
        now = time.monotonic()
        if job.rate_ref is None or done < job.rate_ref[1]:
            job.rate_ref = (now, done)
            return
        t0, d0 = job.rate_ref
        if now - t0 < 1.0 or done <= d0:
            return
        rate = (done - d0) / (now - t0)
        info["eta_seconds"] = max(0.0, (total - done) / rate)

    def _sample(self, job: _Job, gpus: Tuple[GpuReading, ...]) -> None:
        from trayapp.probes.processes import tree_memory

        pid = job.info.get("pid")
        if not pid:
            return
        mem = tree_memory(int(pid), gpus)
        if mem is None:
            return
        counted = self._meter(job).sample(mem.tree_pids)
        # Each page once (PSS) where the system tells, else the summed RSS.
        job.info["rss_bytes"] = counted if counted is not None else mem.tree_rss_bytes
        job.info["memory_method"] = job.meter.method
        job.info["vram_bytes"] = mem.vram_bytes
        job.info["pids"] = list(mem.tree_pids)
        for p in mem.tree_pids:
            if p not in job.known:
                try:
                    job.known[p] = psutil.Process(p)
                except psutil.Error:
                    pass

    @staticmethod
    def _meter(job: _Job) -> Any:
        if job.meter is None:
            from trayapp.probes.processes import TreeMeter

            job.meter = TreeMeter()
        return job.meter

    def tree_bytes(self, job_id: str, pids: Sequence[int]) -> Optional[int]:
        """A job's memory now from its processes ``pids``, each page counted once as of the
        last exact reading (cheap enough for every guard tick); None for a job not watched or
        no readable process."""
        with self._lock:
            job = self._jobs.get(job_id)
            meter = job.meter if job is not None else None
        if meter is None:
            return None
        return meter.read(pids)

    # -- the loop -----------------------------------------------------------------------------

    def tick(self, snapshot: Optional[Snapshot] = None) -> None:
        """Reap ended jobs, sample each tree's memory (at most 4 Hz), move stops and pause
        deadlines along, save progress. Cheap when nothing is due."""
        gpus: Tuple[GpuReading, ...] = tuple(snapshot.gpus) if snapshot is not None else \
            tuple(self._gpus())
        if snapshot is not None:
            self._memory_total = snapshot.memory.total_bytes  # cgroup-aware
        events: List[_Event] = []
        with self._lock:
            now = time.monotonic()
            for job in list(self._jobs.values()):
                if job.state not in LIVE_STATES:
                    continue
                try:
                    self._tick_job(job, now, gpus, events)
                except Exception:  # one job's trouble must not stop the others' watch
                    log.exception("job %s: watching failed", job.id)
            if (self._orphans or self._groups) and now - self._orphans_checked >= 1.0:
                self._orphans_checked = now
                self._reap_orphans()
        for kind, level, message, job_id, data in events:
            self._emit(kind, message, level=level, job_id=job_id, data=data)

    def _reap_orphans(self) -> None:
        """Reap what ended jobs left behind once it exits (and is ours to reap)."""
        live_roots = {job.popen.pid for job in self._jobs.values() if job.popen is not None}
        for group in list(self._groups):
            if not _reap_group(group, live_roots):
                self._groups.discard(group)
        for pid, p in list(self._orphans.items()):
            try:
                if p.is_running():
                    if p.status() != psutil.STATUS_ZOMBIE:
                        continue
                    if not _reap(p) and psutil.pid_exists(p.ppid()) and p.ppid() != 1:
                        continue  # its parent still runs: it comes to us when that ends
            except psutil.Error:
                pass
            self._orphans.pop(pid, None)

    def _tick_job(self, job: _Job, now: float, gpus: Tuple[GpuReading, ...],
                  events: List[_Event]) -> None:
        if not job.exit_seen:
            code, gone = self._poll_exit(job)
            if gone:
                job.exit_seen = True
                job.info["exit_code"] = code
                job.info["pids"] = []
        if job.exit_seen:
            # A stop ends only when the whole tree is gone; anything else ends with its root.
            if job.state == "stopping" and self._remnants(job):
                if job.stop_stage == 1:
                    self._stop_step(job, 2)  # the runner is gone: no one left to ask
                self._advance_stop(job, now)
                return
            if job.state == "parking":
                self._kill_remnants(job, signal.SIGTERM if not WINDOWS else None)
            self._end(job, job.info.get("exit_code"), events=events)
            return
        if now >= job.next_sample:
            job.next_sample = now + SAMPLE_INTERVAL
            self._sample(job, gpus)
        if job.state == "pausing" and job.pause_deadline is not None and now >= job.pause_deadline:
            self._suspend(job, events, why="the pause deadline passed")
        if job.state == "stopping":
            self._advance_stop(job, now)
        if job.dirty and now - job.last_saved >= SAVE_INTERVAL:
            self._save(job)

    def _poll_exit(self, job: _Job) -> Tuple[Optional[int], bool]:
        """(exit code or None when unknown, whether the root process is gone)."""
        if job.popen is not None:
            rc = job.popen.poll()
            return rc, rc is not None
        proc = job.process
        if proc is None:
            return self._bye_code(job), True
        try:
            gone = not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            gone = True
        return (self._bye_code(job) if gone else None), gone

    @staticmethod
    def _bye_code(job: _Job) -> Optional[int]:
        bye = job.info.get("bye") or {}
        code = bye.get("exit_code")
        return code if isinstance(code, int) and not isinstance(code, bool) else None

    def _end(self, job: _Job, code: Optional[int], *, events: Optional[List[_Event]] = None,
             adopted_gone: bool = False) -> None:
        """Record how the job ended, close its channel and move it out of the live set."""
        info = job.info
        bye = info.get("bye") or {}
        was = info["state"]
        parked = (was == "parking" or bye.get("reason") == "parked") and \
            (code == rp.PARK_EXIT_CODE or (code is None and bye.get("reason") == "parked"))
        if parked:
            state = "parked"
            by, reason = job.park_note
            end_reason = f"parked by {by}" + (f": {reason}" if reason else "")
            kind, level = "job_parked", "info"
            message = f"job {job.id} ({info['name']}) parked; resume it with " \
                      f"'headroom resume {job.id}'"
        elif was == "stopping" or (bye.get("reason") == "stopped"
                                   and code == rp.STOP_EXIT_CODE):
            state = "stopped"
            by, reason = job.stop_note
            end_reason = f"stopped by {by}" + (f": {reason}" if reason else "")
            kind, level = "job_stopped", "info"
            message = f"job {job.id} ({info['name']}) {end_reason}"
            if info.get("checkpoint_dir"):
                message += f"; continue it from its checkpoint with 'headroom resume {job.id}'"
        elif code is None:
            state = "lost"
            end_reason = "the process ended while no engine watched it (exit status unknown)" \
                if adopted_gone else "the process ended (exit status unknown)"
            kind, level = "job_lost", "warn"
            message = f"job {job.id} ({info['name']}): {end_reason}"
        elif code == 0:
            state, end_reason = "finished", "finished"
            kind, level = "job_finished", "info"
            message = f"job {job.id} ({info['name']}) finished"
        else:
            state = "failed"
            end_reason = f"killed by {_signal_name(-code)}" if code < 0 else f"exit status {code}"
            kind, level = "job_failed", "error"
            message = f"job {job.id} ({info['name']}) failed ({end_reason})"
        _move(info, state)
        info.update(exit_code=code, ended=_now(), end_reason=end_reason,
                    pids=[], rss_bytes=None, vram_bytes=None, eta_seconds=None,
                    pause_mode=None, connected=False,
                    resumable=state == "parked" or _resumable_stop(info, state))
        self._close_channel(job)
        job.popen = None
        self._remnants(job)
        self._orphans.update(job.known)  # what still runs, or waits to be reaped
        job.process = None
        job.known = {}
        self._save(job)
        if state != "parked":
            self._jobs.pop(job.id, None)
            self._ended[job.id] = copy.deepcopy(info)
            while len(self._ended) > RECENT_ENDED:
                self._ended.popitem(last=False)
        data = {"state": state, "exit_code": code, "end_reason": end_reason}
        if events is not None:
            events.append((kind, level, message, job.id, data))
        else:
            self._emit(kind, message, level=level, job_id=job.id, data=data)

    # -- pause and resume ---------------------------------------------------------------------

    def pause(self, job_ref: str, *, by: str = "user", reason: str = "",
              deadline: Optional[float] = None) -> Dict[str, Any]:
        """Pause a job: a cooperative pause at the next batch end when its runner hooked
        ``fit``, a suspend of the whole tree when ``deadline`` seconds pass first (default: the
        setting ``guard.pause_deadline_seconds``) or at once without the hook.

        Returns the job dict ("pausing" or "paused"). Raises LookupError for an unknown job,
        ValueError for one that cannot be paused now."""
        events: List[_Event] = []
        with self._lock:
            job = self._live(job_ref, "pause")
            if job.state == "pausing" and deadline is not None:
                # A nearer deadline (the guard sees exhaustion coming) moves the suspend up.
                due = time.monotonic() + max(0.0, float(deadline))
                if job.pause_deadline is None or due < job.pause_deadline:
                    job.pause_deadline = due
                if deadline <= 0:
                    self._suspend(job, events, why=None)
            if job.state in ("paused", "pausing"):
                result = self._public(job)
                self._flush_events(events)
                return result
            if job.state not in ("running", "starting"):
                raise ValueError(f"job {job.id} is {job.state}; it cannot be paused now")
            info = job.info
            info.update(paused_by=by, pause_reason=reason or None, paused_at=_now())
            wait = self._pause_deadline(deadline)
            if info.get("hooked") and wait > 0 and self._send(job, rp.PAUSE):
                _move(info, S.PAUSING)
                info["pause_mode"] = None
                job.pause_deadline = time.monotonic() + wait
                self._save(job)
            else:
                self._suspend(job, events, why=None)
            result = self._public(job)
        self._flush_events(events)
        return result

    def _pause_deadline(self, deadline: Optional[float]) -> float:
        if deadline is not None:
            return max(0.0, float(deadline))
        return float(self._setting("guard.pause_deadline_seconds", 2.0))

    def _suspend(self, job: _Job, events: List[_Event], why: Optional[str]) -> None:
        """Suspend every process of the tree (SIGSTOP); state "paused", mode "suspended"."""
        procs = self._tree(job)
        for p in procs:
            try:
                p.suspend()
            except psutil.Error:
                pass
        # A child forked while the root was being stopped is caught by a second look.
        for p in self._tree(job):
            if p.pid not in {q.pid for q in procs}:
                try:
                    p.suspend()
                except psutil.Error:
                    pass
        job.pause_deadline = None
        info = job.info
        note = f" ({why})" if why else ""
        self._set_paused(job, info.get("paused_by") or "user", info.get("pause_reason") or "",
                         "suspended", events, note=note)

    def _set_paused(self, job: _Job, by: str, reason: str, mode: str, events: List[_Event],
                    note: str = "") -> None:
        info = job.info
        already = info["state"] == "paused"
        _move(info, S.PAUSED)
        info.update(pause_mode=mode, paused_by=by, pause_reason=reason or None)
        if info.get("paused_at") is None:
            info["paused_at"] = _now()
        job.pause_deadline = None
        self._save(job)
        if not already or mode == "suspended":
            how = "suspended" if mode == "suspended" else "paused at a batch end"
            why = f": {reason}" if reason else ""
            events.append(("job_paused",
                           "info" if by == "user" else "warn",
                           f"job {job.id} ({info['name']}) {how} by {by}{why}{note}",
                           job.id, {"by": by, "reason": reason, "pause_mode": mode}))

    def resume(self, job_ref: str, *, by: str = "user", reason: str = "") -> Dict[str, Any]:
        """Resume a paused job (the tree continues and/or the runner is told to), or relaunch
        a parked one from its checkpoint under the same id. Returns the job dict.

        Raises LookupError for an unknown job, ValueError for one that is not paused or parked
        or cannot be relaunched."""
        events: List[_Event] = []
        with self._lock:
            job = self._find(job_ref)
            if not isinstance(job, _Job) and job.get("state") == "stopped":
                return self._resume_stopped(job, by, reason)
            if not isinstance(job, _Job):
                state = job.get("state")
                raise ValueError(f"job {job.get('id')} is {state}; only a paused, parked or "
                                 "stopped job can be resumed")
            if job.state == "parked":
                self._relaunch(job, by, reason)
                result = self._public(job)
            elif job.state in ("paused", "pausing"):
                # The word first: a runner that continues must find it before the next batch.
                self._send(job, rp.RESUME)
                self._resume_tree(job)
                info = job.info
                _move(info, S.RUNNING)
                info.update(pause_mode=None, paused_by=None,
                            pause_reason=None, paused_at=None)
                job.pause_deadline = None
                job.rate_ref = None
                self._save(job)
                why = f": {reason}" if reason else ""
                events.append(("job_resumed", "info",
                               f"job {job.id} ({info['name']}) resumed by {by}{why}", job.id,
                               {"by": by, "reason": reason}))
                result = self._public(job)
            elif job.state == "running":
                return self._public(job)
            else:
                raise ValueError(f"job {job.id} is {job.state}; only a paused, parked or "
                                 "stopped job can be resumed")
        self._flush_events(events)
        return result

    def _resume_tree(self, job: _Job) -> None:
        if not WINDOWS and job.info.get("pid"):
            try:
                os.killpg(int(job.info["pid"]), signal.SIGCONT)
            except OSError:
                pass
        for p in self._tree(job):
            try:
                p.resume()
            except psutil.Error:
                pass

    def _resume_stopped(self, saved: Dict[str, Any], by: str, reason: str) -> Dict[str, Any]:
        """Relaunch a stopped job from its checkpoint under the same id, as a parked one."""
        job_id = str(saved.get("id"))
        if not saved.get("checkpoint_dir"):
            raise ValueError(f"job {job_id} was stopped and has no checkpoint folder: there is "
                             "nothing to continue from (start it again with 'headroom run')")
        folder = self.paths.jobs_dir / job_id
        if not folder.is_dir():
            raise ValueError(f"job {job_id} cannot be relaunched: its folder {folder} is gone")
        try:
            key = (folder / "key").read_bytes()
        except OSError:
            key = b""
        info = copy.deepcopy(saved)
        reset = messages.clean_record(info)  # it may come from the store: checked as adopted
        if reset:
            log.warning("job %s: its saved %s did not pass the checks; reset", job_id,
                        ", ".join(reset))
        job = _Job(info, key)
        self._relaunch(job, by, reason)
        self._ended.pop(job_id, None)
        self._jobs[job_id] = job
        return self._public(job)

    def _relaunch(self, job: _Job, by: str, reason: str) -> None:
        from trayapp.jobs.options import JobSpec, validate

        try:
            data = envfile.restore(job.info.get("spec") or {}, self.paths.jobs_dir / job.id)
            spec = dataclasses.replace(JobSpec.from_json(data), resume=True, fresh=False)
            validate(spec, tuple(self._gpus()), check_paths=True)
            spec = self._with_preset(spec)
        except ValueError as e:  # a SpecError, or an --env value that was not kept
            raise ValueError(f"job {job.id} cannot be relaunched: {one_line(e)}") from None
        if not job.key:
            job.key = secrets.token_bytes(32)
            configmod.atomic_write_bytes(self.paths.jobs_dir / job.id / "key", job.key,
                                         mode=0o600)
        self._open_channel(job)
        try:
            self._launch(job, spec, append=True)
        except ValueError:
            self._close_channel(job)
            raise
        # "spec" stays what the user asked for (a relaunch from it starts afresh).
        job.info["resumed_at"] = _now()
        self._save(job)
        why = f": {reason}" if reason else ""
        self._emit("job_resumed", f"job {job.id} ({job.info['name']}) relaunched from its "
                   f"checkpoint by {by}{why} (pid {job.info['pid']})", job_id=job.id,
                   data={"by": by, "reason": reason, "relaunched": True})

    # -- park ---------------------------------------------------------------------------------

    def park(self, job_ref: str, *, by: str = "user", reason: str = "") -> Dict[str, Any]:
        """Ask the runner to checkpoint, end training and exit (state "parking", then "parked"
        when the process has ended with the park exit status). A suspended tree is resumed
        first so it can checkpoint. Returns the job dict.

        Raises ValueError for a job without a checkpoint folder or without the runner's hook
        (parking would lose its progress), LookupError for an unknown job."""
        with self._lock:
            job = self._live(job_ref, "park")
            info = job.info
            if job.state in ("parking",):
                return self._public(job)
            if job.state not in ("running", "pausing", "paused", "starting"):
                raise ValueError(f"job {job.id} is {job.state}; it cannot be parked now")
            if not info.get("checkpoint_dir"):
                raise ValueError(f"job {job.id} has no checkpoint folder: parking would lose its "
                                 "progress (pause or stop it instead)")
            if not info.get("hooked") or job.peer is None:
                raise ValueError(f"job {job.id} does not report to Headroom (no Keras fit "
                                 "hooked): parking would lose its progress (pause or stop it "
                                 "instead)")
            if info.get("pause_mode") == "suspended":
                self._resume_tree(job)
            if not self._send(job, rp.PARK):
                raise ValueError(f"job {job.id} did not take the request (its channel closed)")
            job.park_note = (by, reason)
            _move(info, S.PARKING)
            info.update(pause_mode=None, park_by=by,
                        park_reason=reason or None)
            job.pause_deadline = None
            self._save(job)
            return self._public(job)

    # -- stop ---------------------------------------------------------------------------------

    def stop(self, job_ref: str, *, by: str = "user", reason: str = "",
             force: bool = False) -> Dict[str, Any]:
        """Stop a job in steps: the runner's own stop (when hooked), SIGINT to the group,
        SIGTERM to the tree, SIGKILL (Windows: CTRL_BREAK_EVENT, then terminate); ``force``
        goes straight to SIGKILL. A suspended tree is continued first so it can handle the
        signals. Returns the job dict ("stopping"); ``tick`` finishes the stop.

        Raises LookupError for an unknown job, ValueError for one that has ended."""
        with self._lock:
            job = self._find(job_ref)
            if not isinstance(job, _Job) or job.state not in LIVE_STATES:
                info = job if isinstance(job, dict) else job.info
                if info.get("state") == "parked" and isinstance(job, _Job):
                    return self._stop_parked(job, by, reason)
                raise ValueError(f"job {info.get('id')} is {info.get('state')}; nothing to stop")
            self._begin_stop(job, by, reason, force)
            return self._public(job)

    def kill(self, job_ref: str, *, by: str = "user", reason: str = "") -> Dict[str, Any]:
        """``stop`` straight to SIGKILL."""
        return self.stop(job_ref, by=by, reason=reason, force=True)

    def _stop_parked(self, job: _Job, by: str, reason: str) -> Dict[str, Any]:
        """A parked job has no process: stopping it just closes it (the checkpoint stays)."""
        info = job.info
        _move(info, S.STOPPED)
        info.update(end_reason=f"stopped by {by} while parked"
                    + (f": {reason}" if reason else ""), ended=_now(),
                    resumable=_resumable_stop(info, "stopped"))
        self._save(job)
        self._jobs.pop(job.id, None)
        self._ended[job.id] = copy.deepcopy(info)
        self._emit("job_stopped", f"job {job.id} ({info['name']}) {info['end_reason']}",
                   job_id=job.id, data={"state": "stopped", "exit_code": info.get("exit_code")})
        return copy.deepcopy(info)

    def _begin_stop(self, job: _Job, by: str, reason: str, force: bool,
                    ask: bool = True) -> None:
        info = job.info
        if job.state != "stopping":
            job.stop_note = (by, reason)
            _move(info, S.STOPPING)
            info.update(stop_by=by, stop_reason=reason or None)
            job.pause_deadline = None
            self._save(job)
            if info.get("pause_mode") == "suspended":
                # A stopped process cannot handle a signal; it must run again to end cleanly.
                self._resume_tree(job)
                info["pause_mode"] = None
            if force:
                self._stop_step(job, 4)
            elif ask and info.get("hooked") and self._send(job, rp.STOP):
                self._stop_step(job, 1)
            else:
                self._stop_step(job, 2)
        elif force and job.stop_stage < 4:
            self._stop_step(job, 4)

    def _advance_stop(self, job: _Job, now: float) -> None:
        if now < job.stop_next:
            return
        if job.stop_stage < 4:
            self._stop_step(job, job.stop_stage + 1)
        elif self._remnants(job):
            # SIGKILL did not end them all (a process stuck in the kernel): keep trying.
            self._stop_step(job, 4)

    def _stop_step(self, job: _Job, stage: int) -> None:
        """Take stop step ``stage`` now and set when the next one is due."""
        job.stop_stage = stage
        if stage == 1:
            job.stop_grace = False  # a new stop, asked of the runner
        now = time.monotonic()
        pid = int(job.info.get("pid") or 0)
        if stage == 1:
            job.stop_next = now + STOP_ASK_SECONDS
        elif stage == 2:
            if WINDOWS:  # pragma: no cover - Windows only
                try:
                    os.kill(pid, signal.CTRL_BREAK_EVENT)  # type: ignore[attr-defined]
                except OSError:
                    pass
            else:
                self._killpg(pid, signal.SIGINT)
            job.stop_next = now + STOP_INT_SECONDS
        elif stage == 3:
            if WINDOWS:  # pragma: no cover - Windows only
                for p in self._tree(job, with_remnants=True):
                    try:
                        p.terminate()
                    except psutil.Error:
                        pass
            else:
                self._killpg(pid, signal.SIGTERM)
                self._signal_tree(job, signal.SIGTERM)
            job.stop_next = now + STOP_TERM_SECONDS
        else:
            if not WINDOWS:
                self._killpg(pid, signal.SIGKILL)
            for p in self._tree(job, with_remnants=True):
                try:
                    p.kill()
                except psutil.Error:
                    pass
            job.stop_next = now + KILL_WAIT_SECONDS
        log.info("job %s: stop step %d", job.id, stage)

    def _killpg(self, pid: int, sig: int) -> None:
        if pid <= 1:
            return
        try:
            os.killpg(pid, sig)
        except OSError:
            pass

    def _signal_tree(self, job: _Job, sig: int) -> None:
        for p in self._tree(job, with_remnants=True):
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass

    def _kill_remnants(self, job: _Job, sig: Optional[int]) -> None:
        for p in self._remnants(job):
            try:
                if sig is None:
                    p.terminate()
                else:
                    p.send_signal(sig)
            except psutil.Error:
                pass

    def stop_all(self, reason: str, timeout: float = 7.0) -> None:
        """Stop every live job and wait (up to ``timeout`` seconds) until they have ended;
        what is left then is killed. Starts at SIGINT: the engine is on its way out."""
        with self._lock:
            for job in list(self._jobs.values()):
                if job.state in LIVE_STATES:
                    self._begin_stop(job, "engine", reason, force=False, ask=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.active_count():
            self.tick(None)
            time.sleep(0.05)
        with self._lock:
            for job in list(self._jobs.values()):
                if job.state in LIVE_STATES:
                    self._stop_step(job, 4)
        end = time.monotonic() + 2.0
        while time.monotonic() < end and self.active_count():
            self.tick(None)
            time.sleep(0.05)

    def pause_all(self, *, by: str = "user", reason: str = "") -> List[Dict[str, Any]]:
        """Pause every running job; returns their dicts."""
        with self._lock:
            ids = [j.id for j in self._jobs.values() if j.state in ("running", "starting")]
        out = []
        for job_id in ids:
            try:
                out.append(self.pause(job_id, by=by, reason=reason))
            except (LookupError, ValueError):
                continue
        return out

    def close(self) -> None:
        """The engine exits: close every job's channel and save its state. The jobs keep
        running; the next engine adopts them."""
        self._log_keeper.close()
        with self._lock:
            self._closed = True
            # What ended jobs left to this process (as their subreaper) is collected now: once
            # it exits, a zombie would pass to whoever is next up the tree.
            self._reap_orphans()
            for job in self._jobs.values():
                if job.server is not None:
                    job.server.close()
                    job.server = None
                job.peer = None
                if job.popen is not None:
                    # Let go of the child: it runs on, and a later engine adopts it.
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", ResourceWarning)
                        job.popen = None
                if job.state in LIVE_STATES:
                    job.info["connected"] = False
                    self._save(job)

    # -- the tree -----------------------------------------------------------------------------

    def _tree(self, job: _Job, with_remnants: bool = False) -> List[psutil.Process]:
        """The root and its descendants now (a fresh look), plus with ``with_remnants`` every
        process seen in the tree earlier that still runs (reparented children)."""
        out: Dict[int, psutil.Process] = {}
        root = job.process
        if root is not None:
            try:
                if root.is_running():
                    out[root.pid] = root
                    for c in root.children(recursive=True):
                        out[c.pid] = c
                        job.known.setdefault(c.pid, c)
            except psutil.Error:
                pass
        if with_remnants:
            for p in self._remnants(job):
                out.setdefault(p.pid, p)
        return list(out.values())

    def _remnants(self, job: _Job) -> List[psutil.Process]:
        """Processes seen in the tree that still run. Zombies handed to the engine (the
        subreaper) are reaped; one whose parent is still in the tree is kept in view, as it
        comes to the engine when that parent is gone."""
        alive = []
        root = job.popen.pid if job.popen is not None else None
        for pid, p in list(job.known.items()):
            try:
                # is_running() compares the create time, so a reused pid does not count.
                if p.is_running():
                    if p.status() != psutil.STATUS_ZOMBIE:
                        alive.append(p)
                        continue
                    if pid == root:
                        continue  # Popen collects it
                    if not _reap(p) and p.ppid() in job.known:
                        continue
            except psutil.Error:
                pass
            job.known.pop(pid, None)
        if job.popen is not None and job.popen.poll() is None and job.process is not None:
            if job.process.pid not in {p.pid for p in alive}:
                alive.append(job.process)
        return alive

    # -- logs ---------------------------------------------------------------------------------

    def log(self, job_ref: str, offset: Optional[int] = None,
            max_bytes: Optional[int] = None) -> Dict[str, Any]:
        """The job's output from byte ``offset`` (default: the last 64 KiB).

        Returns ``{"data": text, "offset": next offset, "size": file size, "start": offset
        read from}``; a character cut at either end is left for the next read. Raises
        LookupError for an unknown job, ValueError for a negative offset."""
        info = self.get(job_ref)
        path = Path(str(info.get("log_path") or self.paths.jobs_dir / info["id"] / "log"))
        limit = LOG_MAX_BYTES if max_bytes is None else max(1, min(int(max_bytes),
                                                                    LOG_MAX_BYTES))
        if offset is not None and offset < 0:
            raise ValueError("job_log: offset must be 0 or more")
        try:
            with _open_log_to_read(path) as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                tail = offset is None
                start = max(0, size - LOG_TAIL_BYTES) if offset is None else offset
                if start > size:  # trimmed (at its marker) or replaced (from the top)
                    start = joblog.marker_offset(f.fileno(), self._log_cap(info)) or 0
                f.seek(start)
                data = f.read(min(limit, size - start))
        except FileNotFoundError:
            return {"data": "", "offset": offset or 0, "size": 0, "start": offset or 0}
        except OSError as e:
            raise ValueError(f"cannot read the log of job {info['id']}: "
                             f"{e.strerror or one_line(e)}") from None
        skip = 0
        if tail and start > 0:
            while skip < len(data) and skip < 4 and (data[skip] & 0xC0) == 0x80:
                skip += 1
        keep = _complete_utf8(data)
        text = data[skip:keep].decode("utf-8", errors="replace")
        return {"data": text, "offset": start + keep, "size": size, "start": start + skip}

    def _log_cap(self, info: Dict[str, Any]) -> int:
        """The cap a job's log was launched with (the setting for one launched before)."""
        process = info.get("process")
        cap = process.get("log_max_bytes") if isinstance(process, dict) else None
        if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
            return cap
        return int(self._setting("jobs.log_max_mb", 32)) * 1024 * 1024

    def _running_logs(self) -> List[Tuple[str, int]]:
        """(log path, cap) of every job with a process, for the log keeper's thread."""
        with self._lock:
            return [(str(j.info["log_path"]), self._log_cap(j.info))
                    for j in self._jobs.values()
                    if j.state in LIVE_STATES and j.info.get("log_path")]

    # -- the control channel's job_action -----------------------------------------------------

    def _op_action(self, peer: Peer, args: Dict[str, Any]) -> Dict[str, Any]:
        action = args["action"]
        ref = args["job"]
        reason = args.get("reason") or ""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r} (one of {', '.join(ACTIONS)})")
        if action == "pause":
            job = self.pause(ref, by="user", reason=reason)
            wait = self._pause_deadline(None) + 1.0
        elif action == "resume":
            job = self.resume(ref, by="user", reason=reason)
            wait = 0.0
        elif action == "park":
            job = self.park(ref, by="user", reason=reason)
            wait = 45.0
        elif action == "stop":
            job = self.stop(ref, by="user", reason=reason)
            wait = STOP_ASK_SECONDS + STOP_INT_SECONDS + STOP_TERM_SECONDS + 3.0
        else:
            job = self.stop(ref, by="user", reason=reason, force=True)
            wait = KILL_WAIT_SECONDS
        return self._settle(job, wait)

    def _settle(self, job: Dict[str, Any], wait: float) -> Dict[str, Any]:
        """Wait (at most ``wait`` seconds) for an action to finish; the job dict then."""
        deadline = time.monotonic() + wait
        while job.get("state") in BUSY_STATES - {"starting"} and time.monotonic() < deadline:
            time.sleep(0.05)
            try:
                job = self.get(str(job["id"]))
            except LookupError:
                break
        return job

    # -- helpers ------------------------------------------------------------------------------

    def _find(self, job_ref: str) -> Any:
        """The _Job (live or parked) or the saved dict of an ended job; LookupError else."""
        ref = str(job_ref).strip()
        if not ref:
            raise LookupError("no job named ''")
        if ref in self._jobs:
            return self._jobs[ref]
        if ref in self._ended:
            return self._ended[ref]
        saved = self.store.get_job(ref)
        if isinstance(saved, dict):
            return saved
        current = list(self._jobs.values())
        for matcher in (lambda i, n: i.startswith(ref) and len(ref) >= 4,
                        lambda i, n: n == ref):
            hits = [j for j in current if matcher(j.id, j.info.get("name"))]
            if len(hits) == 1:
                return hits[0]
            if len(hits) > 1:
                raise LookupError(f"{ref} matches {len(hits)} jobs "
                                  f"({', '.join(j.id for j in hits)}); use the id")
        older: Dict[str, Dict[str, Any]] = {}
        for job in self.store.list_jobs(include_finished=True, limit=500):
            if isinstance(job, dict) and job.get("id"):
                older[str(job["id"])] = job
        for k, v in self._ended.items():
            older[k] = v
        for matcher in (lambda i, n: i.startswith(ref) and len(ref) >= 4,
                        lambda i, n: n == ref):
            found = [j for i, j in older.items() if matcher(i, j.get("name"))]
            if len(found) == 1:
                return found[0]
            if len(found) > 1:
                raise LookupError(f"{ref} matches {len(found)} jobs "
                                  f"({', '.join(str(j['id']) for j in found[:5])}); use the id")
        raise LookupError(f"no job named {ref}")

    def _live(self, job_ref: str, what: str) -> _Job:
        job = self._find(job_ref)
        if not isinstance(job, _Job) or job.state not in LIVE_STATES:
            info = job if isinstance(job, dict) else job.info
            raise ValueError(f"job {info.get('id')} is {info.get('state')}; it cannot be "
                             f"{'parked' if what == 'park' else what + 'd'}")
        return job

    def _public(self, job: _Job) -> Dict[str, Any]:
        return copy.deepcopy(job.info)

    def _save(self, job: _Job) -> None:
        job.dirty = False
        job.last_saved = time.monotonic()
        self.store.save_job(copy.deepcopy(job.info))

    def _setting(self, name: str, default: Any) -> Any:
        try:
            return self._config()[name]
        except (KeyError, TypeError):
            return default

    def _flush_events(self, events: List[_Event]) -> None:
        for kind, level, message, job_id, data in events:
            self._emit(kind, message, level=level, job_id=job_id, data=data)


# -- module helpers ----------------------------------------------------------------------------


def become_subreaper() -> bool:
    """Linux: make this process the one that orphaned descendants are handed to, so what a
    job's tree leaves behind stays visible (and is reaped here, leaving no zombie) instead of
    going to init. True when it worked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(36, 1, 0, 0, 0)) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _reap_group(group: int, live_roots: Set[int]) -> bool:
    """Reap this process's exited children in process group ``group`` (a job's tree), but not
    a live job's root, which its Popen collects. False once nothing of the group is left."""
    waitid = getattr(os, "waitid", None)
    if WINDOWS or waitid is None:  # pragma: no cover - no zombies, or no waitid (macOS)
        return False
    for _ in range(256):
        try:
            # WNOWAIT: look first, so that a job's root is left to its Popen.
            found = waitid(os.P_PGID, group, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            break  # no child of ours in the group
        if found is None or found.si_pid in live_roots:
            break
        try:
            os.waitpid(found.si_pid, os.WNOHANG)
        except ChildProcessError:
            break
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # it exists (a member we may not signal)
    return True


def _reap(proc: psutil.Process) -> bool:
    """Collect a zombie that is our child (an orphan of a job tree), nothing else; True when
    it was ours."""
    if WINDOWS:  # pragma: no cover - no zombies there
        return False
    try:
        if proc.ppid() != os.getpid():
            return False
        os.waitpid(proc.pid, os.WNOHANG)
        return True
    except (psutil.Error, ChildProcessError, OSError):
        return False


def _same_process(pid: Any, create_time: Any) -> Optional[psutil.Process]:
    """The process ``pid`` if it is the one that was started (same create time) and lives."""
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        proc = psutil.Process(pid)
        if isinstance(create_time, (int, float)) and abs(proc.create_time() - create_time) > 0.05:
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None


_GUARD_FIELDS = ("id", "name", "state", "pid", "pids", "rss_bytes", "vram_bytes", "hooked",
                 "checkpoint_dir", "ram_budget_bytes", "vram_budget_bytes", "paused_by",
                 "auto_resume", "park_by")


def _guard_fields(info: Dict[str, Any]) -> Dict[str, Any]:
    """The part of a job's record that ``guard_jobs`` gives the guard (the engine's own
    fields; the pids copied, the spec reduced to its ``auto_resume``)."""
    out = {name: info.get(name) for name in _GUARD_FIELDS}
    out["pids"] = list(info.get("pids") or ())
    spec = info.get("spec")
    out["spec"] = {"auto_resume": spec.get("auto_resume")} if isinstance(spec, dict) else {}
    return out


def _progress_units(info: Dict[str, Any]) -> Tuple[Optional[float], Optional[float]]:
    """(done, total) training steps over all epochs, from the runner's 1-based epoch and the
    steps done in it; (None, None) when the runner does not know."""
    epoch, epochs = info.get("epoch"), info.get("epochs")
    step, steps = info.get("step"), info.get("steps")
    if not isinstance(epochs, (int, float)) or not epochs or not isinstance(epoch, (int, float)):
        return None, None
    if isinstance(steps, (int, float)) and steps > 0:
        done = max(0.0, (epoch - 1) * steps + float(step or 0))
        return done, float(epochs * steps)
    return max(0.0, float(epoch) - 1), float(epochs)


def _complete_utf8(data: bytes) -> int:
    """Length of ``data`` without a UTF-8 character cut off at its end."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0x80 == 0:
            return n
        if b & 0xC0 == 0xC0:  # a lead byte: is its character complete?
            need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4
            return n if back >= need else n - back
    return n


def _resumable_stop(info: Dict[str, Any], state: str) -> bool:
    """A stopped job with a checkpoint folder continues from it on ``resume``."""
    return state == "stopped" and bool(info.get("checkpoint_dir"))


def _budget(spec: Any, name: str) -> Optional[int]:
    for attr in (f"{name}_bytes", name, f"{name}_mb"):
        value = getattr(spec, attr, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value * 1024 * 1024) if attr.endswith("_mb") else int(value)
    return None


def _open_log_to_read(path: Path) -> Any:
    """A job's log, opened to read without following a link or waiting on a FIFO (the job's
    script can put either in its folder). Raises OSError, one that says what is wrong."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) \
        | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(e.errno, "it is a link, not a regular file") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "it is not a regular file")
        return open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _open_job_log(path: Path) -> Any:
    """The job's log, opened to append (the job's stdout and stderr: O_APPEND, so writes land at
    the end after the log keeper trims it). Raises ValueError saying why it cannot be opened."""
    try:
        return private.open_private_file(path, "ab")
    except OSError as e:
        raise ValueError(f"cannot start the job: cannot open its log {path}: "
                         f"{e.strerror or one_line(e)}") from None


MIN_FREE_BYTES = 1024 * 1024  # what a new job's folder needs at least: key, spec, first output


def _check_free_space(folder: Path) -> None:
    """Refuse (ValueError, one line) a start on a disk with (almost) no room left."""
    statvfs = getattr(os, "statvfs", None)
    if statvfs is None:  # pragma: no cover - Windows: the writes themselves say it
        return
    try:
        st = statvfs(folder)
    except OSError:
        return  # the folder's own trouble is reported by the writes
    if st.f_bavail * st.f_frsize < MIN_FREE_BYTES:
        raise ValueError(f"cannot start the job: no space left on device under {folder} "
                         f"({configmod.format_bytes(st.f_bavail * st.f_frsize)} free)")


def _remove_folder(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
