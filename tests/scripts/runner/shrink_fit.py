"""A small deterministic fit whose weights are written out, to compare a fit trained through
out-of-memory errors (raised by a callback, at chosen batches) with one trained without.

Usage: shrink_fit.py REPORT [--oom EPOCH:BATCH ...] [--above N] [--once FILE] [--keras2]
                       [--oom-in-update N]
  --oom E:B   raise ResourceExhaustedError as batch B (1-based) of epoch E begins (once: a
              fit trained on after it sees that batch again, as a skipped one)
  --above N   ... only while the batch trained is larger than N samples
  --once FILE ... only when FILE does not exist yet (it is created when raising)
  --keras2    train with Keras 2 (tf_keras)
  --oom-in-update N   an out-of-memory error of a GPU inside Adam's update N (1-based): the
              first layer's kernel is updated, what comes after it in the update may be (with
              --once: in one process only)
  --host      ... the error of an allocation that failed on the host (else the device is not
              said, as for an error raised by Python code)
  --hold E:B --gate FILE   batch B (1-based) of epoch E waits, as it begins, until FILE exists
              (REPORT.held is written when it starts waiting): a test parks or stops it there
  --fits N    fit N times, each going on from the one before (--oom and --hold: the last fit);
              REPORT's "fits" has each fit's History
Writes REPORT (JSON): the weights, the optimizer's updates, the loss history and epochs.
"""

import argparse
import json
import os
import sys
import time

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
parser.add_argument("--oom-in-update", type=int, default=0)
parser.add_argument("--host", action="store_true")
parser.add_argument("--hold")
parser.add_argument("--gate")
parser.add_argument("--fits", type=int, default=1)
args = parser.parse_args()
hold = tuple(int(p) for p in args.hold.split(":")) if args.hold else None
at = {tuple(int(p) for p in spot.split(":")) for spot in args.oom}

keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.random((SAMPLES, 8), dtype=np.float32)
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1)])
schedule = keras.optimizers.schedules.ExponentialDecay(0.02, decay_steps=10, decay_rate=0.7)


class Adam(keras.optimizers.Adam):
    """Adam, failing as a GPU out of memory would inside update ``--oom-in-update``."""

    def update_step(self, gradient, variable, learning_rate):
        super().update_step(gradient, variable, learning_rate)
        if args.oom_in_update and self._get_variable_index(variable) == 0:
            tf.py_function(self._fail, [self.iterations, variable], tf.int64)

    @staticmethod
    def _fail(update, _variable):
        if int(update) + 1 == args.oom_in_update and not (args.once and
                                                          os.path.exists(args.once)):
            if args.once:
                open(args.once, "w").close()
            raise tf.errors.ResourceExhaustedError(
                None, None, "OOM when allocating tensor with shape[8,16] and type float on "
                            "/job:localhost/replica:0/task:0/device:GPU:0 by allocator "
                            "GPU_0_bfc (raised by the test)")
        return update


model.compile(optimizer=(Adam if args.oom_in_update else keras.optimizers.Adam)(schedule),
              loss="mse", metrics=["mae"])


class OutOfMemory(keras.callbacks.Callback):
    def __init__(self, last):
        super().__init__()
        self.last = last

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch + 1

    def on_train_batch_begin(self, batch, logs=None):
        if not self.last:
            return
        if hold == (self.epoch, batch + 1) and args.gate and not os.path.exists(args.gate):
            open(args.report + ".held", "w").close()
            while not os.path.exists(args.gate):
                time.sleep(0.02)
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
        where = " and type float on /job:localhost/replica:0/task:0/device:CPU:0 by allocator " \
                "cpu" if args.host else ""
        raise tf.errors.ResourceExhaustedError(
            None, None, f"OOM when allocating tensor with shape[{size},16]{where} (raised by the "
                        "test)")


fits = []
for n in range(args.fits):
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                        callbacks=[OutOfMemory(n == args.fits - 1)])
    fits.append({"epochs": history.epoch, "history": history.history})
with open(args.report, "w") as f:
    json.dump({"weights": [w.ravel().tolist() for w in model.get_weights()],
               "updates": int(model.optimizer.iterations),
               "accumulation": getattr(model.optimizer, "gradient_accumulation_steps", None),
               "loss": history.history.get("loss"), "epochs": history.epoch,
               "history": history.history, "fits": fits}, f)
