"""A job whose own script takes its runner's channel and never reads from it, as any script
could: it silences the runner's own connection (found among the process's objects), reads the
job's key from the job's folder, connects like the runner does, says it is
"parking" (nobody asked it to), then sends hellos without end and never reads what the engine
sends back. When the engine cuts the connection it connects again and goes on. Stdlib only.

    python never_reads.py MARKER        the flood
    python never_reads.py MARKER quiet  only silences the runner, then sleeps: the test
                                        itself then speaks for the job on its channel

Writes MARKER once it has said "parking" and sent its first hellos (quiet: once the runner is
silenced).
"""

import gc
import json
import os
import sys
import time
from multiprocessing.connection import Client

marker = sys.argv[1]
job_id = os.environ["HEADROOM_JOB_ID"]
home = os.environ["HEADROOM_HOME"]
address = os.environ["HEADROOM_JOB_ADDRESS"]
with open(os.path.join(home, "jobs", job_id, "key"), "rb") as f:
    key = f.read()
family = "AF_PIPE" if sys.platform == "win32" else "AF_UNIX"
hello = json.dumps({"type": "hello", "job_id": job_id, "pid": os.getpid(),
                    "fit_hook": "installed", "hooked": True, "state": "running"}).encode()
parking = json.dumps({"type": "state", "state": "parking"}).encode()

# The runner's connection would say hello too, and take the channel back: closed first.
for obj in gc.get_objects():
    if type(obj).__name__ == "Channel" and hasattr(obj, "hello_changed"):
        obj.close(timeout=0)
if sys.argv[2:] == ["quiet"]:
    with open(marker, "w") as f:
        f.write("quiet\n")
    while True:
        time.sleep(3600)

sent = 0
while True:
    try:
        conn = Client(address, family=family, authkey=key)
        conn.send_bytes(hello)
        conn.send_bytes(parking)
        while True:
            conn.send_bytes(hello)
            sent += 1
            if sent == 50:
                with open(marker, "w") as f:
                    f.write("flooding\n")
            time.sleep(0.0005)
    except (OSError, EOFError):
        time.sleep(0.05)  # cut off: connect again
