"""The processes the guard may act on that are not the engine's jobs: those a
``[[guard.rules]]`` entry names, read from the process list when a warning should name names.

``ForeignProcesses`` reads the list (at most once a second), shows the guard the processes as
``ProcessView``s (a job's own processes are its job's, never a rule's), and carries out what the
ladder decided on one of them: suspend, continue, or stop (SIGTERM, then SIGKILL after
``KILL_SECONDS``). A process is only ever signalled while it is the same process (its pid and
creation time) that the list showed. Those it suspended it continues on ``close()``.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import time
from typing import Dict, List, Optional, Sequence, Tuple

import psutil

from trayapp.engine.guard import Action, JobView, Policy, ProcessView, Rule
from trayapp.errors import Unknown
from trayapp.probes.names import Namer
from trayapp.probes.processes import ProcessRow, ProcessSampler, same_process
from trayapp.vocab import GuardAct as A

log = logging.getLogger("headroom.guard")

TOP_LIMIT = 5  # processes named in a warning
TOP_MIN_INTERVAL = 1.0  # the process list is read at most once a second, and only when short
TOP_MAX_AGE = 2.5  # a sample older than this is not shown
KILL_SECONDS = 5.0  # a process a rule stops gets SIGTERM, then SIGKILL after this


def rule_for(name: str, rules: Sequence[Rule]) -> Optional[Rule]:
    """The first rule whose pattern matches ``name`` (fnmatch), or None."""
    for rule in rules:
        if fnmatch.fnmatch(name, rule.pattern):
            return rule
    return None


class ForeignProcesses:
    """The process list as the guard reads it, and its acts on processes a rule names."""

    def __init__(self, sampler: Optional[ProcessSampler] = None) -> None:
        self._sampler = sampler if sampler is not None else ProcessSampler()
        self._namer = Namer()
        self._top: List[ProcessRow] = []
        self._top_at = -1e18  # monotonic time of the last sample
        self._created: Dict[int, float] = {}  # pid -> creation time, as the last sample read it
        self.paused: Dict[int, Tuple[float, str, int]] = {}  # pid -> (created, name, rss)
        self._stops: Dict[int, Tuple[float, float]] = {}  # pid -> (kill at, created)
        self._self_pid = os.getpid()

    # -- reading ------------------------------------------------------------------------------

    def due(self) -> bool:
        """Whether the list may be read again now."""
        return time.monotonic() - self._top_at >= TOP_MIN_INTERVAL

    def sample(self, policy: Policy) -> None:
        """Read the process list once: the largest by RSS, those growing fastest, and any a
        rule names."""
        self._top_at = time.monotonic()
        rules = policy.rules
        named = (lambda name: rule_for(name, rules) is not None) if rules else None
        self._top = self._sampler.sample(TOP_LIMIT, named, window=policy.rate_window_seconds)
        self._created = {r.pid: r.create_time for r in self._top}

    def views(self, jobs: Sequence[JobView], policy: Policy) -> Tuple[ProcessView, ...]:
        """The processes of the last sample (none once it is older than ``TOP_MAX_AGE``) and
        those suspended by a rule, each with its job or its rule."""
        owner = {pid: j.id for j in jobs for pid in j.pids}
        out: Dict[int, ProcessView] = {}
        if time.monotonic() - self._top_at <= TOP_MAX_AGE:
            for pid, name, rss, created, rate in self._top:
                job_id = owner.get(pid)
                shown = self._namer.name(pid, name, created)  # "train.py", not "python3"
                rule = (
                    None
                    if job_id or pid == self._self_pid
                    else (rule_for(name, policy.rules) or rule_for(shown, policy.rules))
                )
                out[pid] = ProcessView(
                    pid,
                    shown,
                    rss,
                    rate,
                    job_id,
                    rule,
                    pid in self.paused,
                    pid == self._self_pid,
                )
        for pid, (_, name, rss) in self.paused.items():
            if pid not in out:
                out[pid] = ProcessView(
                    pid, name, rss, None, None, rule_for(name, policy.rules), True
                )
        return tuple(out.values())

    # -- acting -------------------------------------------------------------------------------

    def act(self, action: Action) -> None:
        """Suspend, continue or stop the process ``action`` names. Raises ``Unknown`` when it
        is gone (or is another process under its pid now), psutil.Error when a signal fails."""
        pid = action.pid
        assert pid is not None
        created = self._created.get(pid)
        if created is None and pid in self.paused:
            created = self.paused[pid][0]
        proc = same_process(pid, created)
        if proc is None or pid == self._self_pid:
            raise Unknown(f"process {pid} is gone")
        if action.kind == A.PAUSE:
            proc.suspend()
            rss = int(action.data.get("rss_bytes") or 0)
            self.paused[pid] = (proc.create_time(), proc.name(), rss)
        elif action.kind == A.RESUME:
            proc.resume()
            self.paused.pop(pid, None)
        elif action.kind == A.STOP:
            if pid in self.paused:
                proc.resume()  # a stopped process cannot act on SIGTERM
                self.paused.pop(pid, None)
            proc.terminate()
            self._stops[pid] = (time.monotonic() + KILL_SECONDS, proc.create_time())

    def tend(self) -> None:
        """Finish stops (SIGKILL once the grace has passed); forget processes that ended."""
        if self._stops:
            now = time.monotonic()
            for pid, (when, created) in list(self._stops.items()):
                proc = same_process(pid, created)
                if proc is None:
                    del self._stops[pid]
                elif now >= when:
                    try:
                        proc.kill()
                    except psutil.Error:
                        pass
                    del self._stops[pid]
        for pid, (created, _, _) in list(self.paused.items()):
            if same_process(pid, created) is None:
                del self.paused[pid]

    def close(self) -> None:
        """Continue the processes a rule suspended (the engine is going away)."""
        for pid, (created, name, _) in list(self.paused.items()):
            proc = same_process(pid, created)
            if proc is not None:
                try:
                    proc.resume()
                    log.info("continued %s (pid %d) on the way out", name, pid)
                except psutil.Error:
                    pass
        self.paused.clear()
