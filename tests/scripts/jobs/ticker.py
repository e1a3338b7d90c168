"""Print a numbered line every INTERVAL seconds, COUNT times (forever when 0); exit CODE."""

import sys
import time

count = int(sys.argv[1]) if len(sys.argv) > 1 else 0
interval = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
code = int(sys.argv[3]) if len(sys.argv) > 3 else 0
i = 0
while count == 0 or i < count:
    i += 1
    print(f"tick {i}", flush=True)
    time.sleep(interval)
print("done", flush=True)
sys.exit(code)
