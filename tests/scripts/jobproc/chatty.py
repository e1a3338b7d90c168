"""Print a line (and one to stderr) every INTERVAL seconds until the file AFTER exists, then
COUNT more; keep the number of lines in the file PROGRESS (on another disk); exit with CODE."""

import os
import sys
import time

after, progress = sys.argv[1], sys.argv[2]
count, interval, code = int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
i = 0
more = None
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    i += 1
    print(f"line {i} " + "y" * 200, flush=True)
    sys.stderr.write(f"err {i}\n")
    with open(progress + ".tmp", "w") as f:
        f.write(str(i))
    os.replace(progress + ".tmp", progress)
    if more is None and os.path.exists(after):
        more = count
    if more is not None:
        more -= 1
        if more <= 0:
            break
    time.sleep(interval)
print("the end", flush=True)
sys.exit(code)
