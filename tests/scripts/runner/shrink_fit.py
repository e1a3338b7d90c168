"""A small deterministic fit whose weights are written out, to compare a fit trained through
out-of-memory errors (raised by a callback, at chosen batches) with one trained without.

Usage: shrink_fit.py REPORT [--oom EPOCH:BATCH ...] [--above N] [--once FILE] [--keras2]
  --oom E:B   raise ResourceExhaustedError as batch B (1-based) of epoch E begins (once: a
              fit trained on after it sees that batch again, as a skipped one)
  --above N   ... only while the batch trained is larger than N samples
  --once FILE ... only when FILE does not exist yet (it is created when raising)
  --keras2    train with Keras 2 (tf_keras)
Writes REPORT (JSON): the weights, the optimizer's updates, the loss history and epochs.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

if "--keras2" in sys.argv:
    import tf_keras as keras
else:
    import keras
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

SAMPLES, BATCH, EPOCHS = 512, 32, 3

parser = argparse.ArgumentParser()
parser.add_argument("report")
parser.add_argument("--oom", action="append", default=[])
parser.add_argument("--above", type=int, default=0)
parser.add_argument("--once")
parser.add_argument("--keras2", action="store_true")
args = parser.parse_args()
at = {tuple(int(p) for p in spot.split(":")) for spot in args.oom}

keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.random((SAMPLES, 8), dtype=np.float32)
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1)])
schedule = keras.optimizers.schedules.ExponentialDecay(0.02, decay_steps=10, decay_rate=0.7)
model.compile(optimizer=keras.optimizers.Adam(schedule), loss="mse")


class OutOfMemory(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch + 1

    def on_train_batch_begin(self, batch, logs=None):
        steps = self.params.get("steps") or 1
        size = -(-SAMPLES // steps)
        spot = (self.epoch, batch + 1)
        if spot not in at or size <= args.above:
            return
        at.discard(spot)
        if args.once:
            if os.path.exists(args.once):
                return
            open(args.once, "w").close()
        raise tf.errors.ResourceExhaustedError(
            None, None, f"OOM when allocating tensor with shape[{size},16] (raised by the test)")


history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                    callbacks=[OutOfMemory()])
with open(args.report, "w") as f:
    json.dump({"weights": [w.ravel().tolist() for w in model.get_weights()],
               "updates": int(model.optimizer.iterations),
               "accumulation": getattr(model.optimizer, "gradient_accumulation_steps", None),
               "loss": history.history.get("loss"), "epochs": history.epoch}, f)
