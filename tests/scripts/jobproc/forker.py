"""Start a thread and a forked child, write "PID THREAD_ID CHILD_PID" to the file given as the
first argument, then wait (up to a minute) until the file given as the second one exists."""

import os
import sys
import threading
import time

report, release = sys.argv[1], sys.argv[2]
started = threading.Event()
tid = []


def idle() -> None:
    tid.append(threading.get_native_id())
    started.set()
    while not os.path.exists(release):
        time.sleep(0.05)


thread = threading.Thread(target=idle, daemon=True)
thread.start()
started.wait(10)
child = os.fork()
if child == 0:
    deadline = time.monotonic() + 60
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.05)
    os._exit(0)
with open(report + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {tid[0]} {child}\n")
os.replace(report + ".tmp", report)
deadline = time.monotonic() + 60
while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.05)
os.waitpid(child, 0)
print("released", flush=True)
