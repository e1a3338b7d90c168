"""A small fit whose memory is nearly all TensorFlow's own: Dense 16-32-4 with Adam on 1000
samples at batch 32 (31 batches and one of 8), 3 epochs.

Usage: small_fit.py REPORT. Writes REPORT (JSON): the optimizer's updates, the History's epochs
and the process's peak resident memory (the kernel's VmHWM) as the fit ends.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

rng = np.random.default_rng(0)
x = rng.random((1000, 16), dtype=np.float32)
y = rng.integers(0, 4, 1000)
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(4)])
model.compile(optimizer="adam",
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(x, y, batch_size=32, epochs=3, verbose=0, shuffle=False)
peak = None
with open("/proc/self/status") as f:
    for line in f:
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1]) * 1024
with open(sys.argv[1], "w") as f:
    json.dump({"updates": int(model.optimizer.iterations), "epochs": history.epoch,
               "peak_bytes": peak}, f)
