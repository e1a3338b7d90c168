"""A job's transient systemd scope (cgroup v2): the same interface as ``cgroups.JobCgroup``,
so the brake (``braking``) and the pause (``trees``) handle both alike.

How a job gets in: right after its process starts, the user's systemd manager is asked for a
scope holding its pid (``StartTransientUnit`` over the user's D-Bus, through ``busctl``); the
manager moves it (asking PID 1 where the engine runs outside the user's own subtree, as from
a login session), and what the job forks from then on is born inside. The scope's folder is
then found from ``/proc/<pid>/cgroup``.

The brake is ``memory.high``: a task above it stalls in reclaim instead of being killed; the
engine takes it for held there (``under_oom``, as v1's OOM-killer-off wait) when its use is at
the limit and the kernel throttled it lately (``memory.events`` ``high`` rising) or its
scope's pressure (PSI ``full`` avg10) says its tasks stall. ``memory.max`` stays a margin
above (``cgroups_v2.max_above``), a last line whose OOM kill (``memory.events`` ``oom_kill``)
is relaunched smaller. A pause is ``cgroup.freeze``. The scope ends, and is collected, when
its last process does: nothing to remove.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from typing import Any, Callable, List, Optional

from trayapp.jobs import cgroups_v2 as v2
from trayapp.jobs.cgroups import (
    PREFIX,
    V2,
    CgroupError,
    Offer,
    Reading,
    _below,
    _why,
    own_cgroups,
    signal_each,
    stop_and_thaw,
)
from trayapp.jobs.cgroups import parse_keyed as _keyed
from trayapp.text import one_line

# How long the engine waits for the manager to have moved a new job into its scope.
PLACE_SECONDS = 5.0
ASK_SECONDS = 10.0  # the most one busctl call may take
PROC = "/proc"


def reading_v2(
    current: str, high: str, stat: str, events: str, pressure: str, throttled_lately: bool
) -> Reading:
    """A ``Reading`` from the texts of a scope's memory files (``pressure`` "" where PSI is
    off); ``throttled_lately``: its ``high`` count rose within the last window. Raises
    ValueError for garbage."""
    st = _keyed(stat)
    ev = _keyed(events)
    psi = v2.parse_pressure(pressure)
    usage = int(current.strip())
    limit = v2.parse_limit(high)
    full = v2.psi_avg10(psi, "full")
    near = limit is not None and usage >= limit - v2.high_slack(limit)
    held = near and (throttled_lately or (full is not None and full >= v2.PSI_FULL_STALL))
    return Reading(
        usage=usage,
        limit=limit,
        anon=st.get("anon", 0),
        file=st.get("file", 0),
        inactive_file=st.get("inactive_file", 0),
        under_oom=held,
        oom_kill=ev.get("oom_kill", 0),
        failcnt=ev.get("high", 0),
        high_events=ev.get("high", 0),
        max_events=ev.get("max", 0),
        psi_some=v2.psi_avg10(psi, "some"),
        psi_full=full,
    )


def _ask(argv: List[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=ASK_SECONDS,
        check=False,
    )


class ScopeCgroup:
    """A job's transient scope (see the module docstring). ``memory`` and ``freezer`` are
    both its folder; each method says what went wrong in a ``CgroupError``."""

    kind = V2

    def __init__(self, folder: str, unit: str, clock: Callable[[], float] = time.monotonic):
        self.memory = folder
        self.freezer: Optional[str] = folder
        self.unit = unit
        self.limit: Optional[int] = None  # the last memory.high written
        self._clock = clock
        self._high_seen: Optional[int] = None  # memory.events "high" at the last read
        self._high_at: Optional[float] = None  # when it last rose
        self._seen = 0  # the most it was seen using (memory.peak goes with the scope)
        self._kills = 0  # the OOM kills it was last seen with

    def __repr__(self) -> str:
        return f"ScopeCgroup({self.memory!r})"

    @classmethod
    def start(
        cls,
        offer: Offer,
        job_id: str,
        pid: int,
        proc: Optional[str] = None,
        ask: Optional[Callable[[List[str], dict], subprocess.CompletedProcess]] = None,
        environ: Optional[dict] = None,
        wait: float = PLACE_SECONDS,
    ) -> ScopeCgroup:
        """Ask the user's systemd manager for a scope holding process ``pid`` and wait until
        it is in it. Raises CgroupError (no manager, a refusal, the process gone, too slow).
        ``proc``, ``ask`` (how busctl is run): the module's ``PROC`` and ``_ask``."""
        proc = PROC if proc is None else proc
        ask = _ask if ask is None else ask
        if offer.kind != V2 or offer.memory_mount is None:
            raise CgroupError(f"no systemd scopes for jobs here ({offer.words})")
        unit = v2.scope_name(PREFIX, job_id, pid)
        env = v2.manager_environ(os.environ if environ is None else environ, os.getuid())
        try:
            done = ask(v2.start_argv(unit, pid, f"Headroom job {job_id}"), env)
        except (OSError, subprocess.SubprocessError) as e:
            raise CgroupError(
                f"cannot ask the systemd user manager for a scope: {one_line(e)}"
            ) from None
        if done.returncode != 0:
            said = (
                one_line((done.stderr or done.stdout or "").strip())
                or f"busctl exited with {done.returncode}"
            )
            raise CgroupError(f"the systemd user manager made no scope for it: {said}")
        deadline = time.monotonic() + wait
        while True:
            try:
                with open(os.path.join(proc, str(pid), "cgroup")) as f:
                    path = own_cgroups(f.read()).get("", "")
            except OSError:
                raise CgroupError("it ended before its scope was made") from None
            if os.path.basename(path) == unit:
                folder = _below(offer.memory_mount, path)
                if os.path.basename(folder) == unit:
                    return cls(folder, unit)
            if time.monotonic() >= deadline:
                raise CgroupError(
                    f"the systemd user manager did not move it into {unit} within {wait:g} s"
                )
            time.sleep(0.01)

    @classmethod
    def of_process(
        cls, offer: Offer, pid: int, job_id: str, proc: str = "/proc"
    ) -> Optional[ScopeCgroup]:
        """The scope an earlier engine made for job ``job_id`` when process ``pid`` is still
        in it (an adopted job); None otherwise."""
        if offer.memory_mount is None:
            return None
        try:
            with open(os.path.join(proc, str(pid), "cgroup")) as f:
                path = own_cgroups(f.read()).get("", "")
        except OSError:
            return None
        name = os.path.basename(path)
        if not v2.is_scope_of(name, PREFIX, job_id):
            return None
        folder = _below(offer.memory_mount, path)
        if os.path.basename(folder) != name:
            return None
        return cls(folder, name)

    # -- files --------------------------------------------------------------------------------

    def _read(self, name: str, missing_ok: bool = False) -> str:
        try:
            with open(os.path.join(self.memory, name)) as f:
                return f.read()
        except FileNotFoundError:
            if missing_ok and os.path.isdir(self.memory):
                return ""
            raise CgroupError(f"its scope {self.memory} is gone") from None
        except OSError as e:
            if e.errno == errno.ENODEV:  # the kernel is removing it: as good as gone
                raise CgroupError(f"its scope {self.memory} is gone") from None
            raise CgroupError(f"cannot read {name} of {self.memory}: {_why(e)}") from None

    def _write(self, name: str, value: str) -> None:
        try:
            with open(os.path.join(self.memory, name), "w") as f:
                f.write(value)
        except FileNotFoundError:
            raise CgroupError(f"its scope {self.memory} is gone") from None
        except OSError as e:
            if e.errno == errno.ENODEV:
                raise CgroupError(f"its scope {self.memory} is gone") from None
            raise CgroupError(
                f"cannot write {value} to {name} of {self.memory}: {_why(e)}"
            ) from None

    # -- what the engine does -----------------------------------------------------------------

    def add(self, pid: int) -> bool:
        """Move process ``pid`` into the scope (the user owns its ``cgroup.procs``)."""
        self._write("cgroup.procs", str(pid))
        return True

    def set_limit(self, limit: int) -> None:
        """Write ``memory.high`` (and ``memory.max`` a margin above it, written first where
        the limits go up, so that max stays above high); a negative ``limit``: no limit."""
        if limit < 0:
            self._write("memory.high", "max")
            self._last_line("max")
            self.limit = None
            return
        limit = int(limit)
        top = str(v2.max_above(limit))
        if self.limit is None or limit > self.limit:
            self._last_line(top)
            self._write("memory.high", str(limit))
        else:
            self._write("memory.high", str(limit))
            self._last_line(top)
        self.limit = limit

    def _last_line(self, value: str) -> None:
        try:
            self._write("memory.max", value)
        except CgroupError as e:
            if "is gone" in str(e):
                raise
            # The brake is memory.high; a memory.max the kernel refused leaves the one before.

    def read(self) -> Reading:
        """Its use, limit, events and pressure now. Raises CgroupError."""
        texts = [
            self._read(n) for n in ("memory.current", "memory.high", "memory.stat", "memory.events")
        ]
        pressure = self._read("memory.pressure", missing_ok=True)
        count = _keyed(texts[3]).get("high")
        now = self._clock()
        if count is not None:
            if self._high_seen is not None and count > self._high_seen:
                self._high_at = now
            self._high_seen = count
        lately = self._high_at is not None and now - self._high_at <= v2.HIGH_WINDOW_SECONDS
        try:
            r = reading_v2(texts[0], texts[1], texts[2], texts[3], pressure, lately)
        except ValueError:
            raise CgroupError(
                f"the memory files of {self.memory} cannot be read as numbers"
            ) from None
        self._seen = max(self._seen, r.usage)
        self._kills = r.oom_kill
        return r

    def oom_killed(self, since: int, ask: Optional[Callable[..., Any]] = None) -> Optional[int]:
        """After its run ended: how much it held when the kernel's OOM killer ended it (its
        ``oom_kill`` count above ``since``), None where that did not happen. The manager
        removes an emptied scope at once, so where it is gone already the manager's word for
        it (the scope's result ``oom-kill``) is asked; the failed scope is then reset."""
        try:
            if self.read().oom_kill <= since:
                return None
            return max(self._seen, self.peak())
        except CgroupError as e:
            if "is gone" not in str(e):
                raise
        ask = _ask if ask is None else ask
        env = v2.manager_environ(os.environ, os.getuid())
        try:
            said = ask(v2.result_argv(self.unit), env)
            if said.returncode != 0 or said.stdout.strip() != "oom-kill":
                return None if self._kills <= since else max(self._seen, self.limit or 0)
            ask(v2.reset_argv(self.unit), env)
        except (OSError, subprocess.SubprocessError):
            return None
        return max(self._seen, self.limit or 0)

    def peak(self) -> int:
        """The most it has used (``memory.peak``; its use now on kernels before 5.19)."""
        text = self._read("memory.peak", missing_ok=True) or self._read("memory.current")
        try:
            return int(text.strip())
        except ValueError:
            raise CgroupError(f"the peak of {self.memory} cannot be read as a number") from None

    def pids(self) -> List[int]:
        """The processes in it now. Raises CgroupError."""
        return [int(p) for p in self._read("cgroup.procs").split() if p.isdigit()]

    def freeze(self) -> bool:
        """Freeze every process of the job (``cgroup.freeze``), those it forks meanwhile
        included. Raises CgroupError."""
        self._write("cgroup.freeze", "1")
        return True

    def thaw(self) -> bool:
        self._write("cgroup.freeze", "0")
        return True

    def freezer_state(self) -> Optional[str]:
        """THAWED, FREEZING (asked, not all frozen yet) or FROZEN. Raises CgroupError."""
        asked = self._read("cgroup.freeze").strip() == "1"
        frozen = _keyed(self._read("cgroup.events")).get("frozen", 0) == 1
        if frozen:
            return "FROZEN"
        return "FREEZING" if asked else "THAWED"

    def hand_over(self) -> int:
        """A frozen job for no engine to watch: every process of it stopped by SIGSTOP, then
        the scope thawed (it stays paused, and the next engine takes it back). Returns how
        many were stopped; raises CgroupError."""
        return stop_and_thaw(self)

    def kill(self) -> int:
        """SIGKILL every process in it (``cgroup.kill`` where the kernel has it: 5.14+).
        Returns how many there were; raises CgroupError."""
        pids = self.pids()
        if os.path.exists(os.path.join(self.memory, "cgroup.kill")):
            try:
                self._write("cgroup.kill", "1")
                return len(pids)
            except CgroupError as e:
                if "is gone" in str(e):
                    raise
        return signal_each(pids, signal.SIGKILL)

    def remove(self) -> None:
        """The engine lets go of the scope: the manager collects it when its last process
        ends (what is still in it lives on in it), so only its limits are lifted and it is
        thawed: nothing is left held or frozen with no engine watching. Never raises."""
        if not os.path.isdir(self.memory):
            return
        for name in ("memory.high", "memory.max"):
            try:
                self._write(name, "max")
            except CgroupError:
                pass
        self.limit = None
        try:
            if self.freezer_state() != "THAWED":
                self.thaw()
        except CgroupError:
            pass


def reset_failed() -> None:
    """Forget the failed job scopes the user's manager keeps (jobs the OOM killer ended while
    no engine asked about them). Best effort, never raises."""
    try:
        _ask(v2.reset_argv(PREFIX + "*.scope"), v2.manager_environ(os.environ, os.getuid()))
    except (OSError, subprocess.SubprocessError):
        pass
