"""A fit whose host memory grows with its batch: one wide layer (32768 units), so each sample
of the batch holds 128 KiB of activations (measured on tensorflow-cpu: a peak RSS of about
1.6 GB at batch 4096, 1.1 GB at 2048, 0.8 GB at 1024).

Usage: wide_fit.py REPORT BATCH EPOCHS. Writes REPORT (JSON): the optimizer's updates, its
accumulation steps, a sum of each weight's magnitudes and the epochs of the last fit() call.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

report, batch, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
keras.utils.set_random_seed(0)
x = np.random.default_rng(0).random((8192, 64), dtype=np.float32)
y = x[:, :1] * 2.0
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32768, activation="relu"),
                          keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.001), loss="mse")
history = model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0)
with open(report, "w") as f:
    json.dump({"updates": int(model.optimizer.iterations),
               "weights": [float(np.abs(w).sum()) for w in model.get_weights()],
               "accumulation": model.optimizer.gradient_accumulation_steps,
               "epochs": history.epoch}, f)
