"""Print a line and exit with the status given as the first argument."""

import sys

print("about to exit with", sys.argv[1], flush=True)
sys.exit(int(sys.argv[1]))
