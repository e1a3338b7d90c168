"""A memory hog for the guard's tests: allocates CHUNK_MB chunks at RATE_MB_S (MiB per second),
touching every page, up to MAX_MB; then holds it all until killed.

    python hog.py CHUNK_MB RATE_MB_S MAX_MB [PROGRESS_FILE]

After each chunk the MiB allocated so far go to stdout and, when given, as a line
"<MiB> <unix time>" appended to PROGRESS_FILE, so a test can tell how far the hog got, how fast,
and whether it moves again.
"""

import sys
import time

MiB = 1 << 20
PAGE = 4096

chunk_mb = float(sys.argv[1])
rate = float(sys.argv[2])
max_mb = float(sys.argv[3])
progress = sys.argv[4] if len(sys.argv) > 4 else None

chunk = int(chunk_mb * MiB)
held = []
done = 0
start = time.perf_counter()


def report(mb):
    print(f"allocated {mb:.0f} MiB", flush=True)
    if progress:
        with open(progress, "a") as f:
            f.write(f"{mb:.1f} {time.time():.6f}\n")


report(0)
while done + chunk <= max_mb * MiB:
    buf = bytearray(chunk)
    buf[::PAGE] = b"\x01" * ((chunk + PAGE - 1) // PAGE)  # fault every page in
    held.append(buf)
    done += chunk
    report(done / MiB)
    due = start + (done / MiB) / rate
    pause = due - time.perf_counter()
    if pause > 0:
        time.sleep(pause)
while True:
    time.sleep(3600)
