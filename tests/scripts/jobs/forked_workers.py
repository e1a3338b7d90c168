"""A parent that allocates and touches MB megabytes, then forks N workers that only sleep: their
RSS each counts the parent's pages (shared, copy on write), so the tree's summed RSS is about
N + 1 times what it really uses. Prints "ready" once all are forked; ends after SECONDS (its
workers with it).

usage: forked_workers.py MB N SECONDS
"""

import os
import signal
import sys
import time

mb, n, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
block = bytearray(mb * 1024 * 1024)
for i in range(0, len(block), 4096):
    block[i] = 1
kids = []
parent = os.getpid()
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        while os.getppid() == parent:  # a worker does not outlive its parent by long
            time.sleep(0.5)
        os._exit(0)
    kids.append(pid)
print("ready", flush=True)
try:
    time.sleep(seconds)
finally:
    for pid in kids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid in kids:
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass
print("done", flush=True)
