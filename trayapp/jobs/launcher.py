"""Where the job manager used to be, one module: the names other parts import from here.

The manager is ``trayapp.jobs.manager.JobManager``, built of parts beside it: ``table`` (the
jobs and the store), ``runner_link`` (the runner's messages), ``starting`` (launching),
``control`` (pause, resume, park, stop), ``ladder`` (the stop's steps, a pure function),
``trees`` (process trees), ``logpages`` (logs) and ``eta``.
"""

from __future__ import annotations

from trayapp.jobs.control import ACTIONS
from trayapp.jobs.job import move
from trayapp.jobs.manager import JobManager

__all__ = ["ACTIONS", "JobManager", "move"]
