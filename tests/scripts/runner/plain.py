"""Plain Python, no TensorFlow: behaviours of `python script.py` the runner must keep.

usage: plain.py MODE [OUT]
  exit CODE      sys.exit(int(CODE))
  message        sys.exit("a message")
  raise          an uncaught exception two calls deep
  interrupt      an uncaught KeyboardInterrupt
  env OUT        write what the script sees to OUT (JSON)
  tick SECONDS   print a line every 0.1 s for SECONDS, then exit 0
"""

import json
import os
import sys
import time


def inner():
    raise ValueError("raised by the script")


def outer():
    inner()


mode = sys.argv[1]
if mode == "exit":
    sys.exit(int(sys.argv[2]))
elif mode == "message":
    sys.exit("a message from the script")
elif mode == "raise":
    outer()
elif mode == "interrupt":
    raise KeyboardInterrupt
elif mode == "env":
    with open(sys.argv[2], "w") as f:
        json.dump(
            {
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "unbuffered": os.environ.get("PYTHONUNBUFFERED"),
                "keyfile_in_environment": "HEADROOM_JOB_KEYFILE" in os.environ,
                "tensorflow_loaded": "tensorflow" in sys.modules,
                "name": __name__,
                "file": __file__,
                "argv": sys.argv,
                "path0": sys.path[0],
            },
            f,
        )
elif mode == "tick":
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        print("tick", flush=True)
        time.sleep(0.1)
