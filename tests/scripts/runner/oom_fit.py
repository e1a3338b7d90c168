"""A fit whose full batch does not fit under an address-space limit on its interpreter: one wide
layer (65536 units) on 8 features, so a sample's activations take 256 KiB while its compute
stays small. With a 2.5 GiB limit on tensorflow-cpu (oneDNN off), batch 16384 raises
ResourceExhaustedError in fit() at once; a fresh process fits batch 1024, not 2048.

Usage: oom_fit.py REPORT BATCH EPOCHS [SAMPLES (8192) [OPTIMIZER (sgd | adam)]]. Writes REPORT
(JSON): the loss history, the optimizer's updates and its accumulation steps.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

report, batch, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
samples = int(sys.argv[4]) if len(sys.argv) > 4 else 8192
adam = len(sys.argv) > 5 and sys.argv[5] == "adam"
keras.utils.set_random_seed(0)
x = np.random.default_rng(0).random((samples, 8), dtype=np.float32)
y = x[:, :1] * 2.0
model = keras.Sequential([
    keras.Input((8,)),
    keras.layers.Dense(65536, activation="relu"),
    keras.layers.Dense(1),
])
model.compile(optimizer=keras.optimizers.Adam(0.001) if adam else keras.optimizers.SGD(0.001),
              loss="mse")
history = model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0)
with open(report, "w") as f:
    json.dump({"loss": history.history.get("loss"), "epochs": history.epoch,
               "updates": int(model.optimizer.iterations),
               "accumulation": model.optimizer.gradient_accumulation_steps}, f)
