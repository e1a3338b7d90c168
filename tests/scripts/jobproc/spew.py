"""Print COUNT lines of LINE bytes as fast as print() goes, between a first and a last line that
say so; write the largest size the log reached (its size before each print plus the line) to
the file given as the third argument."""

import os
import sys

count, line, report = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
body = "x" * (line - 1)
print("FIRST LINE OF THE SPEW", flush=True)
peak = 0
for _ in range(count):
    size = os.fstat(1).st_size
    peak = max(peak, size + line)
    print(body)
print(f"LAST LINE OF THE SPEW after {count} lines", flush=True)
with open(report, "w") as f:
    f.write(f"{peak}\n")
