"""A hog that waits at a gate: allocates CHUNK_MB chunks (every page touched) up to GATE_MB,
waits until the file GATE exists, then goes on up to MAX_MB and holds it all until killed.

    python gated_hog.py CHUNK_MB GATE_MB MAX_MB PROGRESS GATE

After each chunk the MiB allocated so far are appended to PROGRESS as a line "<MiB>".
"""

import os
import sys
import time

MiB = 1 << 20
PAGE = 4096

chunk_mb, gate_mb, max_mb = (float(a) for a in sys.argv[1:4])
progress, gate = sys.argv[4], sys.argv[5]
held = []
done = 0.0


def report() -> None:
    with open(progress, "a") as f:
        f.write(f"{done:.1f}\n")


report()
while done + chunk_mb <= max_mb:
    if done + chunk_mb > gate_mb:
        while not os.path.exists(gate):
            time.sleep(0.02)
    buf = bytearray(int(chunk_mb * MiB))
    buf[::PAGE] = b"\x01" * ((len(buf) + PAGE - 1) // PAGE)
    held.append(buf)
    done += chunk_mb
    report()
while True:
    time.sleep(3600)
