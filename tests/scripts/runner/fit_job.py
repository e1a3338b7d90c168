"""A small Keras job for the runner's tests: reports what it sees inside TensorFlow.

usage: fit_job.py OUT [--epochs N] [--fits N] [--steps N] [--sleep SECONDS] [--exit CODE]
                  [--hold-epoch N --gate FILE]

Writes OUT.json at the end (dtype policy, thread counts, XLA, environment, argv, epochs and
batches its own callback saw, the optimizer's step count); appends each epoch it begins to
OUT.epochs and each batch it ends to OUT.batches as it goes; OUT.after-fit once fit() returned.
With --gate, the first batch of epoch --hold-epoch waits until FILE exists (OUT.held is written
when it starts waiting): a test asks for a stop or park while it holds, then opens the gate,
whatever the machine's load.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--fits", type=int, default=1)
parser.add_argument("--steps", type=int, default=10, help="batches an epoch")
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--exit", type=int, default=0)
parser.add_argument("--hold-epoch", type=int, default=None)
parser.add_argument("--gate", default=None)
args = parser.parse_args()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

BATCH = 32
SAMPLES = BATCH * args.steps
rng = np.random.default_rng(0)
x = rng.random((SAMPLES, 8), dtype=np.float32)
y = rng.random((SAMPLES, 1), dtype=np.float32)
model = keras.Sequential(
    [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
)
model.compile(optimizer="adam", loss="mse")


class Witness(keras.callbacks.Callback):
    """The script's own callback: the runner must keep it."""

    def __init__(self):
        super().__init__()
        self.epochs = []
        self.batches = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)
        with open(args.out + ".epochs", "a") as f:
            f.write(f"{epoch}\n")

    def on_train_batch_end(self, batch, logs=None):
        if args.gate and self.epochs[-1:] == [args.hold_epoch] and batch == 0 \
                and not os.path.exists(args.gate):
            open(args.out + ".held", "w").close()
            while not os.path.exists(args.gate):
                time.sleep(0.02)
        self.batches += 1
        with open(args.out + ".batches", "a") as f:
            f.write("1\n")
        if args.sleep:
            time.sleep(args.sleep)


witness = Witness()
for _ in range(args.fits):
    model.fit(x, y, epochs=args.epochs, batch_size=BATCH, verbose=0, callbacks=[witness])
with open(args.out + ".after-fit", "w") as f:
    f.write("fit returned\n")

report = {
    "dtype_policy": keras.config.dtype_policy().name,
    "intra_threads": tf.config.threading.get_intra_op_parallelism_threads(),
    "inter_threads": tf.config.threading.get_inter_op_parallelism_threads(),
    "jit": tf.config.optimizer.get_jit(),
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "keyfile_in_environment": "HEADROOM_JOB_KEYFILE" in os.environ,
    "argv": sys.argv,
    "name": __name__,
    "path0": sys.path[0],
    "epochs_seen": witness.epochs,
    "batches_seen": witness.batches,
    "iterations": int(model.optimizer.iterations.numpy()),
    "steps_per_epoch": SAMPLES // BATCH,
}
with open(args.out + ".json", "w") as f:
    json.dump(report, f)
sys.exit(args.exit)
