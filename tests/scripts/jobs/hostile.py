"""A job whose own script attacks its channel, as any script could: it reads the job's id and
state folder from its environment, reads the job's key, connects like the runner does and sends
what it likes. Stdlib only.

    python hostile.py MARKER [DEPTH]

Sends a progress message whose ``tf_memory`` nests DEPTH lists deep (default 600), a note full
of terminal escapes, a hello with a deep ``options`` and an unknown field, a state the engine
does not know and a number far past 2**63; then writes MARKER and waits to be ended.
"""

import os
import sys
import time
from multiprocessing.connection import Client

marker = sys.argv[1]
depth = int(sys.argv[2]) if len(sys.argv) > 2 else 600

job_id = os.environ["HEADROOM_JOB_ID"]
home = os.environ["HEADROOM_HOME"]
address = os.environ["HEADROOM_JOB_ADDRESS"]
with open(os.path.join(home, "jobs", job_id, "key"), "rb") as f:
    key = f.read()

deep = "[" * depth + "]" * depth
big = str(2**70)
messages = [
    '{"type": "progress", "epoch": 1, "epochs": 3, "tf_memory": ' + deep + "}",
    '{"type": "note", "level": "warn", "message": "\\u001b[2J\\u001b[31mowned\\r\\nfake line"}',
    '{"type": "state", "state": "\\u001b]0;title\\u0007", "epoch": ' + big + "}",
    '{"type": "progress", "step": ' + big + ', "logs": {"loss": ' + deep + "}}",
    '{"type": "checkpointed", "path": ' + deep + ', "epoch": 1e400}',
]
family = "AF_PIPE" if sys.platform == "win32" else "AF_UNIX"
conn = Client(address, family=family, authkey=key)
for m in messages:
    conn.send_bytes(m.encode())
time.sleep(0.5)  # let the engine read them before this connection closes
conn.close()
with open(marker, "w") as f:
    f.write("sent\n")
print("sent", flush=True)
while True:
    time.sleep(3600)
