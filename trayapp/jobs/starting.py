"""Starting a job: its folder, key, spec and environment files, the plan, the process in its own
session with its output to the log; and launching a parked or stopped one again under the same
id, from its checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import psutil

from trayapp import config as configmod
from trayapp import private
from trayapp.errors import Refused
from trayapp.jobs import envfile, logpages
from trayapp.jobs.braking import Brakes
from trayapp.jobs.job import Job, budget_bytes, now
from trayapp.jobs.ladder import Stage
from trayapp.jobs.options import JobSpec, SpecError, apply_preset, validate
from trayapp.jobs.plan import JobProcess, LaunchPlan, build_launch
from trayapp.jobs.record import JobRecord
from trayapp.jobs.record_parts import ProcessSettings
from trayapp.jobs.runner_link import RunnerLink
from trayapp.jobs.stored_spec import StoredSpec
from trayapp.jobs.table import JobTable
from trayapp.jobs.transitions import On
from trayapp.text import one_line
from trayapp.vocab import EventKind as E
from trayapp.vocab import JobState as S

WINDOWS = sys.platform == "win32"
MIN_FREE_BYTES = 1024 * 1024  # what a new job's folder needs at least: key, spec, first output
KEY_BYTES = 32


def refused_on_disk_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A start whose files cannot be written (disk full, read-only, quota) is refused with the
    reason in one line, and leaves no half-made job folder behind."""

    @functools.wraps(fn)
    def wrapper(self: Launcher, *args: Any, **kwargs: Any) -> Any:
        before = folders(self.table.paths.jobs_dir)
        try:
            return fn(self, *args, **kwargs)
        except OSError as e:
            with self.table.lock:
                known = set(self.table.jobs) | set(self.table.ended)
            for name in folders(self.table.paths.jobs_dir) - before - known:
                remove_folder(self.table.paths.jobs_dir / name)
            raise Refused(
                f"cannot start the job: {(e.strerror or one_line(e)).lower()} "
                f"under {self.table.paths.jobs_dir}"
            ) from None

    return wrapper


class Launcher:
    """Starting jobs and launching parked or stopped ones again, on the jobs of ``table``: each
    with its channel (``link``), each run in cgroups of its own where the machine offers them
    (``brakes``)."""

    def __init__(self, table: JobTable, link: RunnerLink, brakes: Brakes) -> None:
        self.table = table
        self.link = link
        self.brakes = brakes

    @refused_on_disk_errors
    def start(
        self,
        spec_json: Dict[str, Any],
        environ: Optional[Dict[str, Any]] = None,
        env_from: Optional[str] = None,
    ) -> JobRecord:
        """Validate the spec and launch it. Returns the new job's record (state "starting").

        ``environ``: the environment of the client that asked (``headroom run`` in a shell), so
        the job sees what ``python script.py`` in that shell would; the engine's own otherwise.
        ``env_from``: a job whose kept ``--env`` values fill the spec's hidden ones (a job's
        spec as shown has its ``env`` values hidden; see ``envfile``).
        Raises ValueError with one line for a bad spec or a launch that fails (no job is
        recorded then)."""
        if self.table.closed:
            raise Refused("the engine is shutting down")
        check_free_space(self.table.paths.jobs_dir)
        if environ is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in environ.items()
        ):
            raise Refused("job_start: environ must map names to strings")
        if envfile.hidden_names(spec_json if isinstance(spec_json, dict) else {}):
            spec_json = envfile.restore(spec_json, self._env_folder(env_from))
        try:
            spec = JobSpec.from_json(spec_json)
            spec_warnings = list(validate(spec, tuple(self.table.gpus()), check_paths=True))
            applied = self.with_preset(spec)
        except SpecError as e:
            raise Refused(one_line(e)) from None
        with self.table.lock:
            job = self._new_job(spec, applied, environ, spec_warnings)
            self.table.jobs[job.id] = job
            self.table.save(job)
            rec = job.rec
        where = f" in {rec.cwd}" if rec.cwd else ""
        self.table.emit(
            E.JOB_STARTED,
            f"job {rec.id} ({rec.name}) started{where} (pid {rec.pid})",
            job_id=rec.id,
            data={"pid": rec.pid, "argv": list(rec.argv), "warnings": spec_warnings},
        )
        return rec

    def _new_job(
        self,
        spec: JobSpec,
        applied: JobSpec,
        environ: Optional[Dict[str, Any]],
        spec_warnings: List[str],
    ) -> Job:
        """The job's folder and files, its channel and its process (under the lock)."""
        # The spec as kept and shown names its --env variables without their values; those
        # (and the shell's environment) are kept for a relaunch in one private file.
        spec_data = envfile.hide(spec.to_json())
        job_id, folder, key = self.new_folder(spec_data)
        envfile.save(folder, environ, spec.env)
        job = Job(self.new_record(job_id, applied, spec_data, folder, spec_warnings), key)
        try:
            self.link.open_channel(job)
            self._launch(job, applied, append=False)
        except ValueError:
            self.link.close_channel(job)
            remove_folder(folder)
            raise
        return job

    def new_folder(self, spec_data: Dict[str, Any]) -> Tuple[str, Path, bytes]:
        """A new job's id, its private folder, its key and its spec.json (under the lock).
        Raises OSError when a file cannot be written (the folder is then removed)."""
        job_id = self._new_id()
        folder = self.table.paths.jobs_dir / job_id
        folder.mkdir(parents=True, exist_ok=False, mode=0o700)
        key = secrets.token_bytes(KEY_BYTES)
        try:
            configmod.atomic_write_bytes(folder / "key", key, mode=0o600)
            configmod.atomic_write(folder / "spec.json", json.dumps(spec_data, indent=2) + "\n")
        except OSError:
            remove_folder(folder)
            raise
        return job_id, folder, key

    def _env_folder(self, env_from: Optional[str]) -> Optional[Path]:
        """The folder of the job ``env_from`` names (None: no such job, or none named)."""
        if not isinstance(env_from, str) or not env_from:
            return None
        with self.table.lock:
            try:
                job = self.table.find(env_from)
            except LookupError:
                return None
        return self.table.paths.jobs_dir / job.id

    def with_preset(self, spec: JobSpec) -> JobSpec:
        """The spec with its preset applied against this machine (GPUs, RAM total), so the
        job's budgets are known here; the stored spec keeps what the user asked for."""
        if not spec.preset:
            return spec
        total = self.table.memory_total or psutil.virtual_memory().total
        return apply_preset(spec, spec.preset, tuple(self.table.gpus()), ram_total_bytes=total)

    def _new_id(self) -> str:
        for _ in range(100):
            job_id = secrets.token_hex(4)
            if job_id in self.table.jobs or job_id in self.table.ended:
                continue
            if (self.table.paths.jobs_dir / job_id).exists() or self.table.store.get_job(
                job_id
            ) is not None:
                continue
            return job_id
        raise Refused("cannot find a free job id")  # pragma: no cover - 2**32 ids

    def new_record(
        self,
        job_id: str,
        spec: JobSpec,
        spec_data: Dict[str, Any],
        folder: Path,
        warnings: List[str],
    ) -> JobRecord:
        auto = spec.auto_resume
        if auto is None:
            auto = bool(self.table.setting("guard.auto_resume", True))
        return JobRecord(
            id=job_id,
            name=spec.name or Path(str(spec.script or "job")).stem,
            state=S.STARTING.value,
            started=now(),
            spec=StoredSpec(spec_data),
            script=str(spec.script),
            checkpoint_dir=str(spec.checkpoint_dir) if spec.checkpoint_dir else None,
            log_path=str(folder / "log"),
            ram_budget_bytes=budget_bytes(spec.ram_budget_mb),
            vram_budget_bytes=budget_bytes(spec.vram_budget_mb),
            auto_resume=bool(auto),
            warnings=tuple(warnings),
        )

    def _launch(self, job: Job, spec: JobSpec, *, append: bool) -> None:
        """Build the plan and start the process in its own session, output to the log."""
        folder = self.table.paths.jobs_dir / job.id
        log_path = Path(str(job.rec.log_path or folder / "log"))
        process = JobProcess.from_config(self.table.config())
        try:
            plan = build_launch(
                spec,
                job_id=job.id,
                address=self.table.paths.job_address(job.id),
                keyfile=str(folder / "key"),
                gpus=tuple(self.table.gpus()),
                base_env=job_environ(folder),
                runner_dir=self.table.runner_dir,
                process=process,
                log_path=str(log_path),
            )
        except Exception as e:  # SpecError and friends: a plan that cannot be made
            raise Refused(one_line(e)) from None
        popen = spawn(plan, log_path, process, append=append)
        job.popen = popen
        # At once: the child is still in Python's start-up and has forked nothing yet.
        self.brakes.cgroup_place(job, popen.pid)
        watch_exit(popen.pid, self.table.wake)
        if not WINDOWS:
            self.table.orphans.groups.add(popen.pid)
        try:
            job.process = psutil.Process(popen.pid)
            create_time: Optional[float] = job.process.create_time()
        except psutil.Error:
            job.process, create_time = None, None
        rec = job.rec
        self.table.move(
            job,
            On.LAUNCHED,
            pid=popen.pid,
            pids=(popen.pid,),
            create_time=create_time,
            argv=tuple(plan.argv),
            cwd=str(plan.cwd) if plan.cwd else None,
            process=ProcessSettings(process.nice, process.oom_score_adj, process.log_max_bytes),
            warnings=rec.warnings + tuple(w for w in plan.warnings if w not in rec.warnings),
        )
        job.known = {popen.pid: job.process} if job.process is not None else {}
        job.exit_seen = False
        job.meter = None  # a new tree
        job.fit_answers = 0  # a new runner, asking again
        job.stop_stage = Stage.NONE
        job.pause_deadline = None
        job.rate_ref = None
        job.next_sample = 0.0

    def relaunch(
        self,
        job: Job,
        by: str,
        reason: str,
        accumulation: Optional[int] = None,
        from_checkpoint: bool = True,
    ) -> None:
        """Launch a parked (or stopped) job again from its checkpoint, under the same id;
        ``accumulation``: at micro-batches of its batch / N (the same training); without
        ``from_checkpoint`` (a job without a checkpoint folder) from the beginning."""
        try:
            data = envfile.restore(dict(job.rec.spec), self.table.paths.jobs_dir / job.id)
            spec = dataclasses.replace(JobSpec.from_json(data), resume=from_checkpoint, fresh=False)
            if accumulation:
                spec = dataclasses.replace(spec, accumulation=accumulation)
            validate(spec, tuple(self.table.gpus()), check_paths=True)
            spec = self.with_preset(spec)
        except ValueError as e:  # a SpecError, or an --env value that was not kept
            raise Refused(f"job {job.id} cannot be relaunched: {one_line(e)}") from None
        if not job.key:
            job.key = secrets.token_bytes(KEY_BYTES)
            configmod.atomic_write_bytes(
                self.table.paths.jobs_dir / job.id / "key", job.key, mode=0o600
            )
        self.link.open_channel(job)
        try:
            self._launch(job, spec, append=True)
        except ValueError:
            self.link.close_channel(job)
            raise
        # "spec" stays what the user asked for (a relaunch from it starts afresh).
        job.change(resumed_at=now())
        self.table.save(job)
        why = f": {reason}" if reason else ""
        said: Dict[str, Any] = {"by": by, "reason": reason, "relaunched": True}
        smaller = ""
        if accumulation and job.rec.batch:
            micro = job.rec.batch // accumulation
            smaller = (
                f" at micro-batches of {micro} x {accumulation} (batch {job.rec.batch}, "
                "the same training)"
            )
            said.update(micro_batch=micro, accumulation=accumulation)
        where = "from its checkpoint" if from_checkpoint else "from the beginning"
        self.table.emit(
            E.JOB_RESUMED,
            f"job {job.id} ({job.rec.name}) relaunched {where}"
            f"{smaller} by {by}{why} (pid {job.rec.pid})",
            job_id=job.id,
            data=said,
        )


# -- the process ---------------------------------------------------------------------------------


def watch_exit(pid: int, then: Callable[[], None]) -> None:
    """Call ``then`` as soon as process ``pid`` (a child) has ended, without reaping it (the
    manager's poll does that): the engine sees a job end at once, not at its next tick, and
    ``headroom run`` returns that much sooner. Linux (``os.waitid``); elsewhere the tick."""
    waitid = getattr(os, "waitid", None)
    if waitid is None:  # pragma: no cover - not on Linux
        return

    def wait() -> None:
        try:
            waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        except OSError:  # reaped already, or not our child
            return
        then()

    threading.Thread(target=wait, name=f"job-exit-{pid}", daemon=True).start()


def spawn(
    plan: LaunchPlan, log_path: Path, process: JobProcess, *, append: bool
) -> subprocess.Popen:
    """Start ``plan`` in its own session (Windows: process group), stdin from nothing,
    stdout and stderr appended to the log. Raises ValueError saying why it did not start."""
    kwargs: Dict[str, Any] = {}
    if WINDOWS:  # pragma: no cover - Windows only
        kwargs["creationflags"] = (
            subprocess.CREATE_NEW_PROCESS_GROUP  # type: ignore
            | subprocess.CREATE_NO_WINDOW  # type: ignore
            | (
                subprocess.BELOW_NORMAL_PRIORITY_CLASS  # type: ignore
                if process.nice > 0
                else 0
            )
        )
    else:
        kwargs["start_new_session"] = True
        if private.user_umask() is not None:
            kwargs["umask"] = private.user_umask()  # the user's, not the engine's 077
    with logpages.open_to_append(log_path) as out:
        if append:
            try:
                out.write(
                    f"\n--- resumed from checkpoint "
                    f"{time.strftime('%Y-%m-%d %H:%M:%S')} ---\n".encode()
                )
                out.flush()
            except OSError:
                pass  # a full disk costs the log this line, not the job its relaunch
        try:
            return subprocess.Popen(
                list(plan.argv),
                env=dict(plan.env),
                cwd=plan.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                close_fds=True,
                **kwargs,
            )
        except OSError as e:
            raise Refused(f"cannot start {plan.argv[0]}: {e.strerror or one_line(e)}") from None


def job_environ(folder: Path) -> Dict[str, str]:
    """The environment a job starts from: its client's, kept at start, else the engine's."""
    environ, _ = envfile.load(folder)
    return environ if environ is not None else dict(os.environ)


def check_free_space(folder: Path) -> None:
    """Refuse (ValueError, one line) a start on a disk with (almost) no room left."""
    statvfs = getattr(os, "statvfs", None)
    if statvfs is None:  # pragma: no cover - Windows: the writes themselves say it
        return
    try:
        st = statvfs(folder)
    except OSError:
        return  # the folder's own trouble is reported by the writes
    if st.f_bavail * st.f_frsize < MIN_FREE_BYTES:
        raise Refused(
            f"cannot start the job: no space left on device under {folder} "
            f"({configmod.format_bytes(st.f_bavail * st.f_frsize)} free)"
        )


def folders(folder: Path) -> Set[str]:
    try:
        return {p.name for p in folder.iterdir()}
    except OSError:
        return set()


def remove_folder(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
