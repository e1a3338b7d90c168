"""Where the job manager used to be, one module: the names other parts import from here.

The manager is ``trayapp.jobs.manager.JobManager``, made of parts beside it that each hold
the one ``table`` (the jobs and the store): ``runner_link`` (the runner's messages),
``braking`` (cgroups, the kernel brake), ``starting`` (launching), ``control`` (pause, resume,
park, stop), ``kernels``; with ``ladder`` (the stop's steps) and ``transitions`` (the state
changes), pure functions, ``trees`` (process trees), ``logpages`` (logs) and ``eta``.
"""

from __future__ import annotations

from trayapp.jobs.control import ACTIONS
from trayapp.jobs.job import move
from trayapp.jobs.manager import JobManager

__all__ = ["ACTIONS", "JobManager", "move"]
