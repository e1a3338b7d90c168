"""A job's cgroups on cgroup v1 (``JobCgroup``): a child of the engine's memory cgroup with
the OOM killer off for it (``memory.oom_control`` = 1: a task at the limit waits in the kernel
instead of being killed) and a child of the engine's freezer cgroup, made, read, limited,
frozen, thawed, handed over and removed. What the machine offers, the readings and the limits
are ``trayapp.jobs.cgroups``; a job's systemd scope on v2 is ``trayapp.jobs.scopes``.
"""

from __future__ import annotations

import os
import signal
from typing import List, Optional

from trayapp.jobs.cgroups import (
    PREFIX,
    CgroupError,
    Offer,
    Reading,
    _below,
    _why,
    own_cgroups,
    reading,
    signal_each,
    stop_and_thaw,
)


class JobCgroup:
    """A job's memory cgroup (and its freezer cgroup, where there is one). Each method says
    what went wrong in a ``CgroupError``."""

    def __init__(self, memory: str, freezer: Optional[str] = None):
        self.memory = memory
        self.freezer = freezer
        self.limit: Optional[int] = None  # the last limit written

    def __repr__(self) -> str:
        return f"JobCgroup({self.memory!r}, {self.freezer!r})"

    @classmethod
    def make(cls, offer: Offer, job_id: str) -> JobCgroup:
        """The job's cgroups, made (or taken again, empty, after an earlier run) under the
        offer's parents, the OOM killer off in the memory one. A freezer that cannot be made
        leaves the job with its memory cgroup only. Raises CgroupError."""
        if not offer.brakes or offer.memory_parent is None:
            raise CgroupError(f"no cgroup for jobs here ({offer.words})")
        name = PREFIX + job_id
        memory = os.path.join(offer.memory_parent, name)
        try:
            os.makedirs(memory, exist_ok=True)
        except OSError as e:
            raise CgroupError(f"cannot make the cgroup {memory}: {_why(e)}") from None
        group = cls(memory)
        try:
            group._write(memory, "memory.oom_control", "1")
        except CgroupError:
            group.remove()
            raise
        if offer.freezer_parent is not None:
            freezer = os.path.join(offer.freezer_parent, name)
            try:
                os.makedirs(freezer, exist_ok=True)
                group.freezer = freezer
            except OSError:
                pass  # pause by SIGSTOP
        return group

    @classmethod
    def of_process(
        cls, offer: Offer, pid: int, job_id: str, proc: str = "/proc"
    ) -> Optional[JobCgroup]:
        """The cgroups an earlier engine made for job ``job_id`` when process ``pid`` is still
        in them (an adopted job); None otherwise."""
        if not offer.brakes or offer.memory_parent is None:
            return None
        try:
            with open(os.path.join(proc, str(pid), "cgroup")) as f:
                own = own_cgroups(f.read())
        except OSError:
            return None
        name = PREFIX + job_id
        if os.path.basename(own.get("memory", "")) != name:
            return None
        memory = _find_named(offer.memory_parent, offer.memory_mount, own["memory"], name)
        if memory is None:
            return None
        freezer = None
        if offer.freezer_parent is not None and os.path.basename(own.get("freezer", "")) == name:
            freezer = _find_named(offer.freezer_parent, offer.freezer_mount, own["freezer"], name)
        return cls(memory, freezer)

    # -- files --------------------------------------------------------------------------------

    def _read(self, folder: str, name: str) -> str:
        try:
            with open(os.path.join(folder, name)) as f:
                return f.read()
        except FileNotFoundError:
            raise CgroupError(f"its cgroup {folder} is gone") from None
        except OSError as e:
            raise CgroupError(f"cannot read {name} of {folder}: {_why(e)}") from None

    def _write(self, folder: str, name: str, value: str) -> None:
        try:
            with open(os.path.join(folder, name), "w") as f:
                f.write(value)
        except FileNotFoundError:
            raise CgroupError(f"its cgroup {folder} is gone") from None
        except OSError as e:
            raise CgroupError(f"cannot write {value} to {name} of {folder}: {_why(e)}") from None

    # -- what the engine does -----------------------------------------------------------------

    def add(self, pid: int) -> bool:
        """Move process ``pid`` (and its threads) into the job's cgroups; the children it
        forks from then on are born in them. Returns False where the freezer refused it
        (the job is then paused by SIGSTOP); raises CgroupError where the memory one did."""
        self._write(self.memory, "cgroup.procs", str(pid))
        if self.freezer is None:
            return True
        try:
            self._write(self.freezer, "cgroup.procs", str(pid))
            return True
        except CgroupError:
            self.freezer = None
            return False

    def move_charges(self) -> bool:
        """Ask that memory a process moved in holds be charged here from then on
        (``memory.move_charge_at_immigrate`` = 3: anonymous and file pages). cgroup v1 only
        (v2 never moves charges; newer kernels may take the write and ignore it). Written
        where the file exists and is writable; False otherwise, never raises."""
        path = os.path.join(self.memory, "memory.move_charge_at_immigrate")
        if not os.path.isfile(path) or not os.access(path, os.W_OK):
            return False
        try:
            with open(path, "w") as f:
                f.write("3")
            return True
        except OSError:
            return False

    def set_limit(self, limit: int) -> None:
        """Write ``memory.limit_in_bytes``. Raises CgroupError (the kernel refuses a limit
        below what it cannot reclaim: busy)."""
        self._write(self.memory, "memory.limit_in_bytes", str(int(limit)))
        self.limit = int(limit)

    def read(self) -> Reading:
        """Its use, limit and OOM state now. Raises CgroupError."""
        m = self.memory
        texts = [
            self._read(m, n)
            for n in (
                "memory.usage_in_bytes",
                "memory.limit_in_bytes",
                "memory.stat",
                "memory.oom_control",
                "memory.failcnt",
            )
        ]
        try:
            return reading(*texts)
        except ValueError:
            raise CgroupError(f"the memory files of {m} cannot be read as numbers") from None

    def peak(self) -> int:
        """The most it has used (``memory.max_usage_in_bytes``). Raises CgroupError."""
        try:
            return int(self._read(self.memory, "memory.max_usage_in_bytes").strip())
        except ValueError:
            raise CgroupError(f"the peak of {self.memory} cannot be read as a number") from None

    def oom_killed(self, since: int) -> Optional[int]:
        """After its run ended: how much it held (its peak) when the kernel's OOM killer
        ended it (its ``oom_kill`` count above ``since``), else None. Raises CgroupError."""
        if self.read().oom_kill <= since:
            return None
        return self.peak()

    def pids(self) -> List[int]:
        """The processes in its memory cgroup now. Raises CgroupError."""
        return [int(p) for p in self._read(self.memory, "cgroup.procs").split() if p.isdigit()]

    def freeze(self) -> bool:
        """Freeze every process of the job, those it forks meanwhile included. False where
        it has no freezer; raises CgroupError. A task waiting at the memory limit stays
        where it is (the freezer reads FREEZING): it is stalled anyway and is frozen as it
        wakes."""
        if self.freezer is None:
            return False
        self._write(self.freezer, "freezer.state", "FROZEN")
        return True

    def thaw(self) -> bool:
        """Thaw it (False where it has no freezer); raises CgroupError."""
        if self.freezer is None:
            return False
        self._write(self.freezer, "freezer.state", "THAWED")
        return True

    def freezer_state(self) -> Optional[str]:
        """THAWED, FREEZING or FROZEN; None without a freezer. Raises CgroupError."""
        if self.freezer is None:
            return None
        return self._read(self.freezer, "freezer.state").strip()

    def hand_over(self) -> int:
        """A frozen job for no engine to watch: every process of it stopped by SIGSTOP, then
        the cgroup thawed, so it stays paused and a SIGKILL from anyone ends it (a task in the
        v1 freezer does not die until thawed). Returns how many were stopped; raises
        CgroupError."""
        return stop_and_thaw(self)

    def kill(self) -> int:
        """SIGKILL every process in it (thawed first: a frozen task does not die until it is
        thawed). Returns how many were signalled; raises CgroupError."""
        try:
            self.thaw()
        except CgroupError:
            pass
        return signal_each(self.pids(), signal.SIGKILL)

    def remove(self) -> None:
        """Thaw it, move what is still in it to the parent cgroups, and remove both folders.
        Raises CgroupError saying what was left (a folder that is gone already is fine)."""
        problems: List[str] = []
        for folder in (self.freezer, self.memory):
            if folder is None:
                continue
            if folder == self.freezer:
                try:
                    self.thaw()
                except CgroupError:
                    pass
            parent = os.path.dirname(folder.rstrip("/"))
            try:
                for pid in self._read(folder, "cgroup.procs").split():
                    try:
                        self._write(parent, "cgroup.procs", pid)
                    except CgroupError:
                        pass  # it ended meanwhile
                os.rmdir(folder)
            except CgroupError as e:
                if "is gone" not in str(e):
                    problems.append(str(e))
            except FileNotFoundError:
                pass
            except OSError as e:
                problems.append(f"cannot remove {folder}: {_why(e)}")
        if problems:
            raise CgroupError("; ".join(problems))


def _find_named(parent: str, mount: Optional[str], path: str, name: str) -> Optional[str]:
    """The folder of a job's cgroup seen at ``path`` in ``/proc/<pid>/cgroup``: under the
    engine's ``parent`` (the usual case) or where the path says under the ``mount``."""
    for candidate in (os.path.join(parent, name), _below(mount or parent, path)):
        if os.path.basename(candidate) == name and os.path.isdir(candidate):
            return candidate
    return None
