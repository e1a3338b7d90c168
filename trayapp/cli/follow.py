"""``headroom run``'s follower: the job's output, its progress and the guard's events on the
terminal until the job ends, and the exit status that says how it ended.

``headroom run`` exits with the script's exit status: 0 when it finished, its own status when it
failed (128 + N when signal N ended it), 130 when it was stopped with Ctrl-C, 75 (EX_TEMPFAIL,
``PARK_EXIT_CODE``) when it was parked and waits for ``headroom resume``, 76 (``STOP_EXIT_CODE``)
when it was stopped (``headroom stop``, the jobs window, the guard; with a checkpoint folder it
waits for ``headroom resume`` too), 1 when its end is unknown. A job that the guard parks and
will resume by itself is followed on, and so is one relaunched under its id (the guard's
"relaunch smaller"). ``headroom attach`` follows a job the same way, and Ctrl-C leaves it running.
"""

from __future__ import annotations

import queue
import signal
import sys
import threading
import time
from typing import Any, Dict, Optional, TextIO

from trayapp import vocab
from trayapp.cli.base import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_NO_ENGINE, EXIT_OK
from trayapp.cli.jobs import progress_text
from trayapp.cli.screen import Screen
from trayapp.config import Paths
from trayapp.engine.client import (
    EngineBusy,
    EngineClient,
    EngineError,
    EngineUnavailable,
    Subscription,
    connect,
)
from trayapp.engine.event_record import EngineEvent
from trayapp.jobs.record import JobRecord
from trayapp.runner.protocol import PARK_EXIT_CODE, STOP_EXIT_CODE
from trayapp.text import one_line
from trayapp.vocab import EventKind as E
from trayapp.vocab import JobState as S

PROGRESS_TTY_SECONDS = 0.5  # the status line is redrawn at most twice a second
PROGRESS_PLAIN_SECONDS = 2.0  # and the plain progress line printed at most every 2 s
POLL_SECONDS = 0.2
JOB_GET_SECONDS = 0.5  # the job is read again at most this often while it runs
ACTION_TIMEOUT_SECONDS = 10.0
LAST_LINES = 15  # of a failed job's log, shown when the output went elsewhere
CTRL_C_REASON = "Ctrl-C in headroom run"
LOUD_LEVELS = ("warn", "error")  # the levels of events (not the guard's) worth a "!"
GUARD_PREFIX = "guard"  # the guard's event kinds (guard_warn, guard_pause...), this job's all shown
# Events about how the job started or ended: the summary at the end says it.
_TOLD_AT_THE_END = frozenset({E.JOB_STARTED, E.JOB_ADOPTED}) | vocab.JOB_END_EVENTS


def exit_status(job: JobRecord, interrupted: bool) -> int:
    """The exit status of ``headroom run`` for a job that ended as ``job`` says."""
    if job.state == S.FINISHED:
        return EXIT_OK
    if job.state == S.PARKED:
        return PARK_EXIT_CODE
    if job.state == S.STOPPED:
        return EXIT_INTERRUPTED if interrupted else STOP_EXIT_CODE
    code = job.exit_code
    if code is not None:
        if code < 0:
            return 128 + (-code)
        if code > 0:
            return code if code < 256 else EXIT_FAILED
    return EXIT_FAILED


class Follower:
    """Shows a job's output, progress and the guard's events until it ends; Ctrl-C parks or
    stops it (twice: stops it at once), or with ``detach`` leaves it running. ``offset``: the
    byte of the log to show the output from."""

    def __init__(
        self,
        client: EngineClient,
        paths: Paths,
        job: JobRecord,
        out: Optional[TextIO] = None,
        err: Optional[TextIO] = None,
        detach: bool = False,
        offset: int = 0,
    ):
        self.client = client
        self.paths = paths
        self.job = job
        self.job_id = job.id
        self.screen = Screen(out or sys.stdout, err or sys.stderr)
        self.tty = self.screen.tty
        self.detach = detach
        self.offset = offset
        self.interrupts = 0
        self.handled = 0
        self.last_progress = 0.0
        self.last_plain = ""
        self.events: queue.Queue[EngineEvent] = queue.Queue()
        self.output_seen = False
        self._stop_events = threading.Event()
        # Set by an event of this job: the loop reads the job at once (its end, say) instead of
        # at its next turn.
        self._woken = threading.Event()
        self._said = threading.Lock()  # the action thread says things too
        self.engine_options: Dict[str, Any] = {}  # how to start an engine if it goes away

    # -- set-up -------------------------------------------------------------------------------

    def say(self, message: object) -> None:
        """``headroom: MESSAGE`` on a line of its own, out of the script's way."""
        with self._said:
            self.screen.note(f"headroom: {one_line(str(message))}")

    def run(self) -> int:
        if self.detach:
            self.say(
                f"following job {self.job_id} ({self.job.name}), {self.job.state}; "
                "Ctrl-C leaves it running"
            )
        else:
            self.say(
                f"job {self.job_id} ({self.job.name}) started; output follows "
                "(Ctrl-C: " + ("park" if self.job.checkpoint_dir else "stop") + " it)"
            )
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
        while not self._stop_events.is_set():
            try:
                with Subscription(self.paths, snapshots=False, events=True) as sub:
                    while not self._stop_events.is_set():
                        msg = sub.get(0.5)
                        event = (
                            EngineEvent.from_json(msg.get("data"))
                            if msg and msg.get("push") == "event"
                            else None
                        )
                        if event is not None:
                            self.events.put(event)
                            if event.job_id == self.job_id:
                                self._woken.set()
            except EngineUnavailable:
                self._stop_events.wait(1.0)
            except Exception:  # never let the side thread end the command
                self._stop_events.wait(1.0)

    # -- the loop -----------------------------------------------------------------------------

    def _loop(self) -> int:
        last_get = 0.0
        busy_said = False
        while True:
            if self.interrupts > self.handled:
                if self.detach:
                    self.screen.end_line()
                    self.say(
                        f"left job {self.job_id}, which goes on running ('headroom attach "
                        f"{self.job_id}' follows it again)"
                    )
                    return EXIT_INTERRUPTED
                if self._interrupt():
                    self.screen.end_line()
                    self.say(f"left job {self.job_id}; the engine goes on ending it")
                    return EXIT_INTERRUPTED
            try:
                drained = self._read_log()
                now = time.monotonic()
                woken = self._woken.is_set()
                self._woken.clear()
                if woken or now - last_get >= JOB_GET_SECONDS or not self.job.is_live:
                    self.job = self.client.job_get(self.job_id)
                    last_get = now
                busy_said = False
            except EngineBusy:
                # It runs, and watches the job: follow on once it answers again (Ctrl-C leaves).
                if not busy_said:
                    self.say(
                        f"the engine is busy and does not answer now; still following job "
                        f"{self.job_id}"
                    )
                    busy_said = True
                self.client.close()
                time.sleep(POLL_SECONDS)
                continue
            except EngineUnavailable:
                if not self._reconnect():
                    self.screen.end_line()
                    self.say(
                        f"the engine went away; job {self.job_id} goes on running "
                        "(see 'headroom jobs')"
                    )
                    return EXIT_NO_ENGINE
                continue
            self._show_events()
            if not self.job.is_live and drained:
                if self.job.is_parked and self._wait_for_auto_resume():
                    time.sleep(POLL_SECONDS)
                    continue
                return self._finish()
            self._show_progress()
            self._woken.wait(POLL_SECONDS)

    def _reconnect(self) -> bool:
        """The engine went away: start one (it adopts the job); False when none comes."""
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
        return self.job.parked_by == vocab.Actor.GUARD and self.job.auto_resume

    def _interrupt(self) -> bool:
        """Act on Ctrl-C; True when the command should leave now."""
        self.handled += 1
        if self.handled == 1:
            if self.job.is_parked:
                return True
            park = bool(self.job.checkpoint_dir) and self.job.hooked
            if park:
                self.say(
                    f"parking job {self.job_id} (checkpoint, then end); Ctrl-C again to "
                    "stop it at once"
                )
            else:
                self.say(f"stopping job {self.job_id}; Ctrl-C again to stop it at once")
            self._act_in_background("park" if park else "stop", fallback="stop")
            return False
        if self.handled == 2:
            self.say(f"stopping job {self.job_id} at once")
            self._act_in_background("kill", fallback=None)
            return False
        return True

    def _act_in_background(self, action: str, fallback: Optional[str]) -> None:
        def act() -> None:
            with EngineClient(self.paths, timeout=ACTION_TIMEOUT_SECONDS) as c:
                try:
                    c.job_action(self.job_id, action, reason=CTRL_C_REASON)
                except EngineError as e:
                    if fallback is None:
                        self.say(e)
                        return
                    self.say(f"{one_line(e)}; stopping it instead")
                    try:
                        c.job_action(self.job_id, fallback, reason=CTRL_C_REASON)
                    except (EngineError, EngineUnavailable) as e2:
                        self.say(e2)
                except EngineUnavailable as e:
                    self.say(e)

        threading.Thread(target=act, daemon=True).start()

    # -- output -------------------------------------------------------------------------------

    def _read_log(self) -> bool:
        """Copy new output to the terminal; True when all of the log has been read."""
        size = 0
        for _ in range(64):
            chunk = self.client.job_log(self.job_id, offset=self.offset)
            data = chunk.data
            self.offset = chunk.offset or self.offset
            size = chunk.size
            if data:
                with self._said:
                    self.screen.output(data)
                self.output_seen = True
            if self.offset >= size or not data:
                break
        return self.offset >= size

    def _show_progress(self) -> None:
        now = time.monotonic()
        text = progress_text(self.job)
        if self.tty:
            # A status line under the output, drawn only where the script's line is not open.
            if now - self.last_progress < PROGRESS_TTY_SECONDS and self.screen.status_shown:
                return
            with self._said:
                if self.screen.status(one_line(text)):
                    self.last_progress = now
            return
        # Plain output: a line when the state or the epoch changed (not at every step: a
        # progress bar of the script's is on its way), at a line start of the script's output.
        key = f"{self.job.state} {self.job.epoch}"
        if key == self.last_plain or now - self.last_progress < PROGRESS_PLAIN_SECONDS:
            return
        if self.job.state in vocab.RUNNING and not self.job.epochs:
            return  # no training progress to tell (a script without fit)
        if self.screen.shared and not self.screen.at_line_start:
            return
        self.last_plain = key
        self.last_progress = now
        self.say(text)

    def _show_events(self) -> None:
        while True:
            try:
                ev = self.events.get_nowait()
            except queue.Empty:
                return
            if not self._worth_showing(ev):
                continue
            mark = "! " if ev.level in LOUD_LEVELS else ""
            self.say(f"{mark}{ev.message}")

    def _worth_showing(self, ev: EngineEvent) -> bool:
        """The guard's events about this job, its runner's warnings, and pauses or resumes
        that someone else asked for (the summary at the end tells how it ended)."""
        data = ev.data or {}
        if ev.job_id != self.job_id and self.job_id not in (data.get("job_ids") or []):
            return False
        kind = ev.kind
        if kind.startswith(GUARD_PREFIX):
            return True
        if kind == E.JOB_NOTE:
            return ev.level in LOUD_LEVELS
        if kind in (E.JOB_PAUSED, E.JOB_RESUMED):
            return data.get("by") != vocab.Actor.GUARD  # the guard's own event says it already
        return kind not in _TOLD_AT_THE_END

    def _finish(self) -> int:
        self.screen.end_line()
        self._show_events()
        job = self.job
        status = exit_status(job, interrupted=self.handled > 0)
        if job.state == S.FINISHED:
            self.say(f"job {self.job_id} finished")
        elif job.state == S.PARKED:
            self.say(
                f"job {self.job_id} parked (checkpoint in {job.checkpoint_dir}); continue it "
                f"with 'headroom resume {self.job_id}'"
            )
        elif job.state == S.STOPPED:
            text = f"job {self.job_id} {job.end_reason or 'stopped'}"
            if job.resumable:
                text += (
                    f" (checkpoint in {job.checkpoint_dir}); continue it with "
                    f"'headroom resume {self.job_id}'"
                )
            self.say(text)
        elif job.state == S.LOST:
            self.say(f"job {self.job_id}: {job.end_reason or 'its end is unknown'}")
        else:
            self.say(f"job {self.job_id} failed ({job.end_reason or 'exit status unknown'})")
            if not self.tty or not self.output_seen:
                self._print_last_lines()
        return status

    def _print_last_lines(self) -> None:
        try:
            chunk = self.client.job_log(self.job_id, offset=None)
        except Exception:
            return
        lines = chunk.data.rstrip("\n").splitlines()[-LAST_LINES:]
        if lines:
            print(f"headroom: the last lines of its output ({self.job.log_path}):", file=sys.stderr)
            for line in lines:
                print(f"  {line}", file=sys.stderr)
            sys.stderr.flush()
