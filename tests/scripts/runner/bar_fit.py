"""A Keras fit that draws Keras's own progress bar (verbose=1): 10 000 samples at batch 32, so
313 batches an epoch, the last one short (16 samples).

usage: bar_fit.py OUT [--epochs N] [--hold-epoch E --hold-batch B --gate FILE]

With --gate, the end of batch B (0-based, as Keras counts the fit's steps) of epoch E waits
until FILE exists, writing OUT.held when it starts to wait: a test asks for a park or a stop
while it holds, then opens the gate, whatever the machine's load. Writes OUT.json at the end
(the optimizer's updates and the History's epochs).
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--hold-epoch", type=int, default=0)
parser.add_argument("--hold-batch", type=int, default=None)
parser.add_argument("--gate", default=None)
args = parser.parse_args()

rng = np.random.default_rng(0)
x = rng.random((10000, 8), dtype=np.float32)
y = rng.random((10000, 1), dtype=np.float32)
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")


class Hold(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if args.gate and self.epoch == args.hold_epoch and batch == args.hold_batch \
                and not os.path.exists(args.gate):
            open(args.out + ".held", "w").close()
            while not os.path.exists(args.gate):
                time.sleep(0.02)


history = model.fit(x, y, batch_size=32, epochs=args.epochs, verbose=1, shuffle=False,
                    callbacks=[Hold()])
with open(args.out + ".json", "w") as f:
    json.dump({"updates": int(model.optimizer.iterations), "epochs": history.epoch}, f)
