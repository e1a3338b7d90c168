"""Allocates MiB at a steady rate once a trigger file exists, writing nothing (its log may sit on
a full disk), then holds the memory.

    python quiet_hog.py TRIGGER_FILE MAX_MB
"""

import os
import sys
import time

trigger, max_mb = sys.argv[1], int(sys.argv[2])
while not os.path.exists(trigger):
    time.sleep(0.05)
held = []
for _ in range(max_mb // 10):
    held.append(bytearray(10 << 20))
    held[-1][::4096] = b"\x01" * len(held[-1][::4096])
    time.sleep(0.05)
while True:
    time.sleep(1)
