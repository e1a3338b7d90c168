"""Each job in cgroups of its own (Linux): the kernel as the guard's brake.

What this machine offers is found once (``detect``): cgroup v1 where the engine's own memory
cgroup takes children (a writable hierarchy; the freezer beside it when mounted), cgroup v2
with a systemd user manager that has the memory controller (a transient scope a job:
``trayapp.jobs.scopes``, found by ``cgroups_v2.user_manager``), or neither. On v1 a job gets
``cgroups_v1.JobCgroup.make``: a child of the engine's memory cgroup with the OOM killer
off for it (``memory.oom_control`` = 1: a task at the limit waits in the kernel instead of
being killed) and a child of the engine's freezer cgroup. The engine writes its limit
(``brake_limit``) on every tick, reads its use, freezes and thaws it, and removes it when the
job has ended.

Every file this module reads or writes is under the cgroupfs root it is given, so the pure
parts (parsing, the limit, detection) are tested on a folder tree made to look like one.
Every failure is a ``CgroupError`` with one line that says what went wrong: the caller logs it
and guards the job without its cgroup, never ends it.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional

from trayapp.formats import format_bytes
from trayapp.jobs import cgroups_v2
from trayapp.jsonvalue import JSONObject

V1 = "v1"
V2 = "v2"
NONE = "none"
# The protection a job has, in words (every surface says one of them) and as a short tag.
WORDS: Mapping[str, str] = {
    V1: "kernel brake (cgroup v1)",
    V2: "kernel brake (cgroup v2, systemd)",
    NONE: "none: the guard only",
}
TAGS: Mapping[str, str] = {V1: "brake-v1", V2: "brake-v2", NONE: "guard"}

ROOT = "/sys/fs/cgroup"
PREFIX = "headroom-job-"  # a job's cgroups are named this and its id
MiB = 1024 * 1024
# What the limit leaves above a job's use where its budget (or the machine) is already below
# it: the job is not made to stall at once; the guard handles it as without the brake.
MARGIN_BYTES = 16 * MiB
# A limit is written again only when it moves by this much (or comes down at all).
WRITE_STEP_BYTES = 1 * MiB
UNLIMITED = 1 << 62  # v1 reads "no limit" as PAGE_COUNTER_MAX pages: anything this large


def signal_each(pids: List[int], sig: int) -> int:
    """Send ``sig`` to each of ``pids`` (the processes of a job's cgroup); how many got it (one
    gone meanwhile is not counted)."""
    count = 0
    for pid in pids:
        try:
            os.kill(pid, sig)
            count += 1
        except OSError:
            pass
    return count


def stop_and_thaw(group: Any) -> int:
    """Hand over a frozen job (a v1 group or a v2 scope: ``freezer_state``, ``pids``,
    ``thaw``) for no engine to watch: every process of it stopped by SIGSTOP, then the group
    thawed, so it stays paused. Returns how many were stopped; 0 when it is not frozen."""
    if group.freezer_state() not in ("FROZEN", "FREEZING"):
        return 0
    count = signal_each(group.pids(), signal.SIGSTOP)
    group.thaw()
    return count


class CgroupError(Exception):
    """A cgroup that cannot be made, read or written: the message says why, in one line."""


# -- what the machine offers ---------------------------------------------------------------------


@dataclass(frozen=True)
class Offer:
    """What this machine offers a job: ``kind`` (V1, V2, NONE), a line saying where or why not,
    and for V1 the engine's own memory and freezer cgroup folders (the jobs' parents); for V2
    the folder of the user's ``user@UID.service`` (both parents) and the v2 mount."""

    kind: str
    why: str = ""
    memory_parent: Optional[str] = None
    freezer_parent: Optional[str] = None  # None: no freezer (pause by SIGSTOP)
    memory_mount: Optional[str] = None  # the hierarchies' tops (an adopted job's cgroup may
    freezer_mount: Optional[str] = None  # be elsewhere than under this engine's)

    @property
    def brakes(self) -> bool:
        """Jobs get cgroups of their own here (v1 children, or v2 scopes)."""
        return self.kind in (V1, V2) and self.memory_parent is not None

    @property
    def words(self) -> str:
        """The protection in words, with why where there is none."""
        if self.brakes:
            return WORDS[self.kind]
        return WORDS[NONE] + (f" ({self.why})" if self.why else "")

    @property
    def tag(self) -> str:
        return TAGS[self.kind] if self.brakes else TAGS[NONE]

    def to_json(self) -> JSONObject:
        return {
            "kind": self.kind if self.brakes else NONE,
            "words": self.words,
            "tag": self.tag,
            "why": self.why,
            "freezer": self.freezer_parent is not None,
        }


def own_cgroups(text: str) -> Dict[str, str]:
    """``/proc/<pid>/cgroup`` -> {controller: path}; the v2 line's path under ``""``. A line
    that is not ``id:controllers:path`` is left out."""
    out: Dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            out[""] = path
            continue
        for name in controllers.split(","):
            if name:
                out.setdefault(name, path)
    return out


def v1_mount(root: str, controller: str, marker: str) -> Optional[str]:
    """The v1 hierarchy under ``root`` that carries ``controller`` (its own folder, or a
    co-mount like ``cpu,memory``), known by the file ``marker`` at its top; None."""
    plain = os.path.join(root, controller)
    if os.path.isfile(os.path.join(plain, marker)) or (
        controller == "freezer" and os.path.isfile(os.path.join(plain, "cgroup.procs"))
    ):
        return plain
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return None
    for name in names:
        if (
            controller in name.split(",")
            and os.path.isdir(os.path.join(root, name))
            and os.path.isfile(os.path.join(root, name, "cgroup.procs"))
        ):
            return os.path.join(root, name)
    return None


def _below(mount: str, path: str) -> str:
    """The folder of cgroup ``path`` under ``mount`` (a container may show the host's path:
    ever shorter tails of it, then the mount itself)."""
    parts = [p for p in path.split("/") if p and p != ".."]
    for start in range(len(parts)):
        candidate = os.path.join(mount, *parts[start:])
        if os.path.isdir(candidate):
            return candidate
    return mount


def _can_make_children(folder: str, probe_it: bool = True) -> Optional[str]:
    """None when a child cgroup can be made (and removed) in ``folder``, else why not; without
    ``probe_it`` only asked of the system (``access``), nothing made."""
    if not probe_it:
        if os.access(folder, os.W_OK):
            return None
        return f"cannot make a cgroup in {folder}: " + (
            "read-only file system" if _read_only(folder) else "permission denied"
        )
    probe = os.path.join(folder, f"{PREFIX}probe-{os.getpid()}")
    try:
        os.mkdir(probe)
    except FileExistsError:
        pass
    except OSError as e:
        return f"cannot make a cgroup in {folder}: {_why(e)}"
    try:
        os.rmdir(probe)
    except OSError:
        pass  # left empty: the next probe of this pid takes it
    return None


def _read_only(folder: str) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def detect(
    root: str = ROOT,
    proc_cgroup: str = "/proc/self/cgroup",
    enabled: bool = True,
    environ: Optional[Mapping[str, str]] = None,
    probe: bool = True,
    uid: Optional[int] = None,
    which: Optional[Callable[[str], Optional[str]]] = None,
) -> Offer:
    """What this machine offers the engine's jobs (``proc_cgroup``: where the engine is).

    V1 when the engine's memory cgroup (under ``root``) takes a child, which is tried (with
    ``probe``; else only asked, as a command that makes nothing does); its freezer beside it
    when that takes one too. V2 where ``/sys/fs/cgroup`` is the unified hierarchy and the
    user's systemd manager runs with the memory controller delegated to it, writable, and can
    be asked for scopes (``cgroups_v2.user_manager``: ``uid``, ``which`` for tests). NONE
    otherwise, with why. Never raises."""
    if not enabled:
        return Offer(NONE, "the kernel brake is off (guard.kernel_brake)")
    try:
        with open(proc_cgroup) as f:
            own = own_cgroups(f.read())
    except OSError:
        return Offer(NONE, "no cgroups on this system")
    if "memory" in own:
        mount = v1_mount(root, "memory", "memory.limit_in_bytes")
        if mount is None:
            return Offer(NONE, "the cgroup v1 memory hierarchy is not mounted")
        parent = _below(mount, own["memory"])
        if not os.path.isfile(os.path.join(parent, "memory.oom_control")):
            return Offer(NONE, f"no memory controller files in {parent}")
        refused = _can_make_children(parent, probe)
        if refused is not None:
            return Offer(NONE, refused)
        freezer = None
        fmount = v1_mount(root, "freezer", "cgroup.procs") if "freezer" in own else None
        if fmount is not None:
            folder = _below(fmount, own["freezer"])
            if _can_make_children(folder, probe) is None:
                freezer = folder
        return Offer(
            V1, f"children of {parent}", parent, freezer, mount, fmount if freezer else None
        )
    if "" in own:
        env = os.environ if environ is None else environ
        user = os.getuid() if uid is None else uid
        service, why = cgroups_v2.user_manager(root, own[""], env, user, which or shutil.which)
        if service is None:
            return Offer(NONE, why)
        return Offer(V2, why, service, service, root, root)
    return Offer(NONE, "no memory cgroup")


# -- readings ------------------------------------------------------------------------------------


def parse_keyed(text: str) -> Dict[str, int]:
    """``key value`` lines (``memory.stat``, ``memory.oom_control``) -> {key: int}; a line that
    is not a key and a whole number is left out."""
    out: Dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return out


@dataclass(frozen=True)
class Reading:
    """One look at a job's memory cgroup, in bytes: its use (``usage``, what the limit is
    held against), the anonymous and file-backed parts of it, the inactive file cache the
    kernel takes back first, the limit; and whether a task waits at the limit
    (``under_oom``), the OOM kills counted in it, how often it hit the limit (``failcnt``).
    On v2 the limit is ``memory.high``, ``failcnt`` its ``high`` events, and the reading has
    the ``high`` and ``max`` counts of ``memory.events`` and the scope's PSI avg10."""

    usage: int
    limit: Optional[int]
    anon: int
    file: int
    inactive_file: int
    under_oom: bool
    oom_kill: int
    failcnt: int
    high_events: Optional[int] = None  # v2 only, from here on
    max_events: Optional[int] = None
    psi_some: Optional[float] = None
    psi_full: Optional[float] = None

    @property
    def working_set(self) -> int:
        """What the job holds that the kernel cannot just drop: its use less inactive cache."""
        return max(0, self.usage - self.inactive_file)

    @property
    def held(self) -> int:
        """The job's RAM as the guard counts it: its working set; while it waits at its limit,
        the limit (it needs more than that: the charge that failed may have left its use a
        batch of pages under it, and the kernel took back what cache it could)."""
        if self.under_oom:
            return max(self.usage, self.limit or 0)
        return self.working_set

    def to_json(self) -> JSONObject:
        out: JSONObject = {
            "usage_bytes": self.usage,
            "limit_bytes": self.limit,
            "anon_bytes": self.anon,
            "file_bytes": self.file,
            "working_set_bytes": self.working_set,
            "under_oom": self.under_oom,
            "oom_kill": self.oom_kill,
            "failcnt": self.failcnt,
        }
        if self.high_events is not None:
            out.update(
                high_events=self.high_events,
                max_events=self.max_events,
                psi_some_avg10=self.psi_some,
                psi_full_avg10=self.psi_full,
            )
        return out


def reading(usage: str, limit: str, stat: str, oom_control: str, failcnt: str) -> Reading:
    """A ``Reading`` from the texts of the five files. Raises ValueError for garbage."""
    st = parse_keyed(stat)
    oom = parse_keyed(oom_control)
    lim = int(limit.strip())
    return Reading(
        usage=int(usage.strip()),
        limit=None if lim >= UNLIMITED else lim,
        anon=st.get("total_rss", st.get("rss", 0)),
        file=st.get("total_cache", st.get("cache", 0)),
        inactive_file=st.get("total_inactive_file", st.get("inactive_file", 0)),
        under_oom=bool(oom.get("under_oom", 0)),
        oom_kill=oom.get("oom_kill", 0),
        failcnt=int(failcnt.strip() or 0),
    )


# -- the brake -----------------------------------------------------------------------------------


def brake_limit(
    usage: int,
    budget: Optional[int],
    available: int,
    reserve: int,
    current: Optional[int],
    margin: int = MARGIN_BYTES,
) -> int:
    """The limit a job's cgroup should have now: the smaller of its ``budget`` and what the
    machine can give it (its ``usage`` + ``available`` - the park ``reserve``).

    Where that is below the job's use plus ``margin`` (a budget it has already passed, or a
    machine at its reserve), the limit never comes down below the use: it stays a margin
    above it (but never above the ``current`` limit, so a job held at its limit stays held
    rather than the limit creeping up a margin a tick)."""
    room = usage + available - reserve
    target = room if budget is None else min(budget, room)
    if target >= usage + margin:
        return target
    ceiling = current if current is not None else UNLIMITED
    return max(target, min(ceiling, max(usage, target) + margin))


def charged_elsewhere(usage: int, tree_rss: Optional[int]) -> int:
    """What a job's processes hold outside its cgroup: a Jupyter kernel moved into one when it
    was adopted keeps the memory it held charged where it was (v1 without
    ``move_charge_at_immigrate``; v2 never moves charges). Its tree's RSS less its cgroup's use,
    never below 0 (0 where the tree's RSS is not known)."""
    if tree_rss is None:
        return 0
    return max(0, int(tree_rss) - int(usage))


def kernel_limit(
    usage: int,
    outside: int,
    budget: Optional[int],
    available: int,
    reserve: int,
    current: Optional[int],
    margin: int = MARGIN_BYTES,
) -> int:
    """The limit of a cgroup whose processes hold ``outside`` bytes charged elsewhere (an
    adopted kernel): ``brake_limit`` of everything the job holds (``usage`` + ``outside``,
    its ``current`` limit counted the same way), less what is charged elsewhere. So the job
    never gets more than its budget in all, nor a limit below what its cgroup holds."""
    outside = max(0, int(outside))
    total = usage + outside
    limit = brake_limit(
        total, budget, available, reserve, None if current is None else current + outside, margin
    )
    return max(usage, limit - outside)


def worth_writing(new: int, current: Optional[int], step: int = WRITE_STEP_BYTES) -> bool:
    """Whether a limit of ``new`` is worth a write over ``current``: one that comes down is
    always written, one that goes up by ``step`` or more."""
    if current is None:
        return True
    return new < current or new - current >= step


# -- a job's cgroups -----------------------------------------------------------------------------


def _why(e: OSError) -> str:
    return (e.strerror or str(e)).lower() if e.errno != errno.EBUSY else "busy"


SIGKILL_BIT = 1 << (9 - 1)  # bit of SIGKILL in /proc/<pid>/status's pending masks


def kill_pending(pids: List[int], proc: str = "/proc") -> bool:
    """Whether a SIGKILL waits for one of ``pids`` (the ``SigPnd`` and ``ShdPnd`` masks of
    ``/proc/<pid>/status``): sent to a frozen task, it takes effect only once thawed."""
    for pid in pids:
        try:
            with open(os.path.join(proc, str(pid), "status")) as f:
                for line in f:
                    if (
                        line.startswith(("SigPnd:", "ShdPnd:"))
                        and int(line.split()[1], 16) & SIGKILL_BIT
                    ):
                        return True
        except (OSError, ValueError, IndexError):
            continue
    return False


def plan_line(enabled: bool, budget_mb: Optional[float], offer: Optional[Offer] = None) -> str:
    """The protection a job with a RAM budget of ``budget_mb`` (None: none) would have here, in
    one line (``headroom run --dry-run``): ``offer``, else this machine's, found by asking
    (``detect`` without making a cgroup)."""
    found = offer if offer is not None else detect(enabled=enabled, probe=False)
    if not found.brakes:
        return f"protection: {found.words}"
    held = (
        f"the smaller of its budget ({format_bytes(budget_mb * MiB)}) and what the "
        "machine can give it"
        if budget_mb
        else "what the machine can give it"
    )
    freezer = (
        "a pause freezes its cgroup"
        if found.freezer_parent
        else "a pause suspends it by signal (no freezer)"
    )
    how = (
        (
            "in a systemd scope of its own, at memory.high (it stalls in reclaim, it is not "
            "killed; memory.max a margin above)"
        )
        if found.kind == V2
        else "with its OOM killer off"
    )
    return (
        f"protection: {found.words}: the kernel holds the job at {held}, {how}; "
        f"stalled there, a fit that can shrink is relaunched at half its "
        f"micro-batch; {freezer}"
    )


def sweep(offer: Offer) -> List[str]:
    """Remove the empty job cgroups an engine left under the offer's parents (its jobs were
    killed while no engine watched them). One with a process in it is left alone (the
    kernel refuses to remove it). Returns the folders removed; never raises. (A v2 scope is
    collected by systemd when it empties: nothing to sweep.)"""
    removed: List[str] = []
    if offer.kind != V1:
        return removed
    for parent in (offer.memory_parent, offer.freezer_parent):
        if parent is None:
            continue
        try:
            names = [n for n in os.listdir(parent) if n.startswith(PREFIX)]
        except OSError:
            continue
        for name in names:
            folder = os.path.join(parent, name)
            try:
                with open(os.path.join(folder, "cgroup.procs")) as f:
                    if f.read().split():
                        continue
                os.rmdir(folder)
                removed.append(folder)
            except OSError:
                continue
    return removed


def tag_of(words: Optional[str]) -> str:
    """The short tag of a protection in words (``headroom jobs``): "brake-v1", "brake-v2",
    "guard"; "" for a job whose record says none (an older engine's)."""
    if not words:
        return ""
    for kind, said in WORDS.items():
        if words.startswith(said):
            return TAGS[kind]
    return TAGS[NONE]
