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
            problems.append(
                f"the job's oom_score_adj is not {oom_score_adj} ({e.strerror or e})"
            )
    return problems
