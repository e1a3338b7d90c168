"""A fit whose full batch does not fit under an address-space limit on its interpreter: samples
of 512 features, two Dense(4096) layers. With a 2.5 GiB limit on tensorflow-cpu (oneDNN off),
batch 16384 raises ResourceExhaustedError in fit(), batch 2048 fits.

Usage: oom_fit.py REPORT BATCH EPOCHS [SAMPLES (8192)]. Writes REPORT (JSON): the loss history,
the optimizer's updates and its accumulation steps.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

report, batch, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.random((int(sys.argv[4]) if len(sys.argv) > 4 else 8192, 512), dtype=np.float32)
y = x[:, :1] * 2.0
model = keras.Sequential([
    keras.Input((512,)),
    keras.layers.Dense(4096, activation="relu"),
    keras.layers.Dense(4096, activation="relu"),
    keras.layers.Dense(1),
])
model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
history = model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0)
with open(report, "w") as f:
    json.dump({"loss": history.history.get("loss"), "epochs": history.epoch,
               "updates": int(model.optimizer.iterations),
               "accumulation": model.optimizer.gradient_accumulation_steps}, f)
