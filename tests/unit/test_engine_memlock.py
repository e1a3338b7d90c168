"""The engine locks its memory only where that cannot starve it later: as root, or with an
unlimited RLIMIT_MEMLOCK. (Found in the test VM: a user's 8 MiB limit let mlockall succeed,
and the engine then could not start a thread for a client.)"""

from __future__ import annotations

import resource

from trayapp.engine.own_process import memlock_refused


def test_a_user_with_a_finite_memlock_limit_is_not_locked() -> None:
    assert memlock_refused(euid=1000, limit=8 * 1024 * 1024) == (
        "RLIMIT_MEMLOCK is 8192 KiB, and a locked engine could not start a thread past it")
    assert memlock_refused(euid=1000, limit=resource.RLIM_INFINITY) == ""
    assert memlock_refused(euid=0, limit=8 * 1024 * 1024) == ""
