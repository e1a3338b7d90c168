"""Forks on and on: a daemon (a double fork, so it leaves the job's process tree) that ticks,
and a short-lived child every 20 ms. Writes the daemon's pid to the file REPORT once it runs,
and ends (the daemon too) when the file STOP exists, or after a minute.

    python forking.py REPORT STOP
"""

import os
import sys
import time

report, stop = sys.argv[1], sys.argv[2]
deadline = time.monotonic() + 60


def done() -> bool:
    return os.path.exists(stop) or time.monotonic() > deadline


first = os.fork()
if first == 0:
    if os.fork() != 0:
        os._exit(0)  # the daemon's parent: gone at once, the daemon is reparented
    with open(report + ".tmp", "w") as f:
        f.write(f"{os.getpid()}\n")
    os.replace(report + ".tmp", report)
    while not done():
        time.sleep(0.01)
    os._exit(0)
os.waitpid(first, 0)
while not done():
    child = os.fork()
    if child == 0:
        time.sleep(0.05)
        os._exit(0)
    time.sleep(0.02)
    os.waitpid(child, 0)
print("stopped forking", flush=True)
