"""A job whose words are hostile. Through its channel, as any script could (see hostile.py), it
sends notes full of terminal escapes, bidi overrides and markup: a warning about its shrunk
batch (the engine makes it an event, the tray a notification), an error and an info note; and a
forecast of 2**60 bytes a sample, which no machine holds. Then it writes MARKER and ticks until
it is ended. Stdlib only.

    python hostile_words.py MARKER
"""

import json
import os
import sys
import time
from multiprocessing.connection import Client

WORDS = "\x1b]0;pwned\x07\x1b[2J\u202e\x9b<a href=x><img src=y>"

marker = sys.argv[1]
job_id = os.environ["HEADROOM_JOB_ID"]
home = os.environ["HEADROOM_HOME"]
with open(os.path.join(home, "jobs", job_id, "key"), "rb") as f:
    key = f.read()

messages = [
    {"type": "note", "level": "warn", "topic": "shrunk", "message": f"shrunk {WORDS} to fit"},
    {"type": "note", "level": "error", "message": f"{WORDS}\r\nheadroom: fake line"},
    {"type": "note", "level": "info", "message": WORDS},
    {"type": "forecast", "fit": 1, "how": "steps", "batch": 2**53, "micro_batch": 2**53,
     "accumulation": 1, "devices": [{"device": "ram", "fixed_bytes": 2**30,
                                     "per_sample_bytes": 2**60, "peak_bytes": 2**31,
                                     "measured_batch": 64}]},
]
family = "AF_PIPE" if sys.platform == "win32" else "AF_UNIX"
conn = Client(os.environ["HEADROOM_JOB_ADDRESS"], family=family, authkey=key)
for m in messages:
    conn.send_bytes(json.dumps(m).encode())
time.sleep(0.5)  # let the engine read them before this connection closes
conn.close()
with open(marker, "w") as f:
    f.write("sent\n")
print("sent", flush=True)
while True:
    time.sleep(0.2)
