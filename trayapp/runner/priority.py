"""The job's place beside the desktop: its CPU priority and how readily the kernel's OOM killer
picks it.

The engine runs above the desktop (nice -5, oom_score_adj -100 where it may); a job started by
it would inherit both. The runner sets the job's own values first thing, before any thread
starts and before the script's code, so every thread and child of the job takes them: Linux
keeps a nice value per thread, and a new thread or process takes its creator's.

Stdlib only, Python >= 3.9: this runs inside the job's interpreter.
"""

import os
import sys


def apply(nice=None, oom_score_adj=None):
    """Set this process's nice value (absolute) and its ``oom_score_adj``; ``None`` leaves one
    as it is. Returns one-line problems (empty when both were applied); never raises.

    Raising a nice value needs no privilege, lowering one does: a job asked to run at 0 under an
    engine niced to 10 by its user stays at 10 (never above what it was given), and says so.
    """
    problems = []
    if nice is not None and hasattr(os, "getpriority"):
        current = None
        try:
            current = os.getpriority(os.PRIO_PROCESS, 0)
            if current < nice:
                os.nice(nice - current)
            elif current > nice:
                os.setpriority(os.PRIO_PROCESS, 0, nice)
        except OSError as e:
            problems.append(
                f"the job runs at nice {current}, not at nice {nice} ({e.strerror or e})"
            )
    if oom_score_adj is not None and sys.platform.startswith("linux"):
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(int(oom_score_adj)))
        except OSError as e:
            problems.append(f"the job's oom_score_adj is not {oom_score_adj} ({e.strerror or e})")
    return problems


def apply_limits(limits):
    """Give this process the resource limits ``{"AS": [soft, hard], ...}`` (None: unlimited),
    those of the shell that ran ``headroom run`` (the job is the engine's child, and would
    have the engine's). A limit may be lowered freely; a hard limit above this process's needs
    privilege: then the soft one goes as high as the hard allows. Returns the problems, one
    line each; never raises."""
    try:
        import resource
    except ImportError:  # Windows: no rlimits
        return []
    problems = []
    inf = resource.RLIM_INFINITY
    for name, pair in sorted((limits or {}).items()):
        which = getattr(resource, f"RLIMIT_{name}", None)
        if which is None or not isinstance(pair, list) or len(pair) != 2:
            continue
        want_soft, want_hard = (inf if v is None else v for v in pair)
        try:
            _, hard = resource.getrlimit(which)
            try:
                resource.setrlimit(which, (want_soft, want_hard))
            except (ValueError, OSError):
                # A hard limit above this one's: keep the hard, the soft as near as it goes.
                soft = (
                    want_soft if hard == inf or (want_soft != inf and want_soft <= hard) else hard
                )
                resource.setrlimit(which, (soft, hard))
                problems.append(
                    f"the job's hard limit {name} stays at the engine's "
                    f"({'unlimited' if hard == inf else hard}), not "
                    f"{'unlimited' if want_hard == inf else want_hard}"
                )
        except (ValueError, OSError) as e:
            problems.append(f"the job's limit {name} could not be set ({e})")
    return problems
