"""Print a numbered line every INTERVAL seconds, COUNT times (forever when 0); exit CODE.

With a fourth argument GATE (a file), it ticks until that file exists instead of COUNT times,
so a test can end it when it is ready rather than after a time it guessed."""

import os
import sys
import time

count = int(sys.argv[1]) if len(sys.argv) > 1 else 0
interval = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
code = int(sys.argv[3]) if len(sys.argv) > 3 else 0
gate = sys.argv[4] if len(sys.argv) > 4 else None
i = 0
while (not os.path.exists(gate)) if gate else (count == 0 or i < count):
    i += 1
    print(f"tick {i}", flush=True)
    time.sleep(interval)
if gate:
    print("gate open", flush=True)
print("done", flush=True)
sys.exit(code)
