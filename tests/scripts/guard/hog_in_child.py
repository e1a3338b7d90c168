"""Runs hog.py, with the same arguments, as a child process and waits for it: a job whose
memory is all in a child of its root.

    python hog_in_child.py CHUNK_MB RATE_MB_S MAX_MB [PROGRESS_FILE]
"""

import os
import subprocess
import sys

hog = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hog.py")
sys.exit(subprocess.call([sys.executable, hog, *sys.argv[1:]]))
