"""Ignore SIGINT and SIGTERM, fork a child that ignores them too, write both pids, and loop."""

import os
import signal
import sys
import time

signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = os.fork()
if child == 0:
    while True:  # the child inherits the ignored signals
        time.sleep(0.1)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {child}\n")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
print("stubborn and its child are running", flush=True)
while True:
    time.sleep(0.1)
