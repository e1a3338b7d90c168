"""Small fits on datasets whose size is not a multiple of the batch, one for each kind of input,
optimizer and weighting, so that fits trained at micro-batches (under the runner) can be
compared with plain Keras at the full batch, case by case.

Usage: exact_fit.py REPORT [--cases NAME,...] [--oom EPOCH:STEP ...]
  --cases   the cases to fit (default: all of CASES, in order)
  --oom     raise ResourceExhaustedError as micro-step STEP (1-based, or "last": the epoch's
            last) of epoch EPOCH begins, once a spot and a fit, while the micro-batch trained is
            larger than 4 samples
Writes REPORT (JSON): {case: {weights, updates, history, epochs, accumulation}}.
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

BATCH, EPOCHS = 64, 3


def schedule():
    return keras.optimizers.schedules.ExponentialDecay(0.02, decay_steps=5, decay_rate=0.6)


OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.05),
    "momentum": lambda: keras.optimizers.SGD(schedule(), momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adam-schedule": lambda: keras.optimizers.Adam(schedule()),
    "adamw": lambda: keras.optimizers.AdamW(schedule(), weight_decay=0.01),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.005),
    "rmsprop-schedule": lambda: keras.optimizers.RMSprop(schedule()),
}

# name: (samples, input, optimizer, options); input: arrays | tensors | dataset | dropped |
# unknown (a dataset whose length is not known) | generator; options "fits": fit() calls (the
# out-of-memory errors raised in the first only).
# 1003 samples at batch 64: 15 batches and one of 43; 1008: one of 48 (whole micro-batches of
# 16); 1200 with validation_split 0.1: 1080 to train, one of 56.
CASES = {
    "arrays-sgd": (1003, "arrays", "sgd", {}),
    "arrays-momentum-schedule": (1003, "arrays", "momentum", {}),
    "arrays-adam-validation-split": (1200, "arrays", "adam", {"validation_split": 0.1}),
    "arrays-adamw-whole-micro-batches": (1008, "arrays", "adamw", {}),
    "arrays-rmsprop-sample-weight": (1003, "arrays", "rmsprop", {"sample_weight": True}),
    "arrays-class-weight": (1003, "arrays", "momentum", {"classes": 3}),
    "tensors-adam-schedule": (1003, "tensors", "adam-schedule", {}),
    "dataset-adam": (1003, "dataset", "adam", {}),
    "dataset-dropped-rmsprop-schedule": (1003, "dropped", "rmsprop-schedule", {}),
    "dataset-validation-data-adamw": (1008, "dataset", "adamw", {"validation": True}),
    "dataset-unknown-length-momentum": (1003, "unknown", "momentum", {}),
    "two-fits": (1003, "arrays", "adam", {"fits": 2}),
    "one-sample": (1, "arrays", "adam", {}),
    "batch-over-the-dataset": (50, "arrays", "sgd", {}),
    "generator": (200, "generator", "adam", {}),
}

parser = argparse.ArgumentParser()
parser.add_argument("report")
parser.add_argument("--cases", default=",".join(CASES))
parser.add_argument("--oom", action="append", default=[])
args = parser.parse_args()


class OutOfMemory(keras.callbacks.Callback):
    def __init__(self, spots):
        super().__init__()
        self.spots = set(spots)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch + 1

    def on_train_batch_begin(self, batch, logs=None):
        steps = self.params.get("steps")
        spot = (self.epoch, "last" if steps and batch + 1 == steps else str(batch + 1))
        accumulation = self.model.optimizer.gradient_accumulation_steps or 1
        if spot not in self.spots or BATCH // accumulation <= 4:
            return
        self.spots.discard(spot)
        raise tf.errors.ResourceExhaustedError(
            None, None, "OOM when allocating tensor with shape[64,16] (raised by the test)")


def case(name):
    samples, kind, optimizer, options = CASES[name]
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.random((samples, 8), dtype=np.float32)
    classes = options.get("classes")
    if classes:
        y = (x[:, :3].argmax(axis=1)).astype("int32")
        out = keras.layers.Dense(classes, activation="softmax")
        loss, metrics = "sparse_categorical_crossentropy", ["accuracy"]
    else:
        y = (x.sum(axis=1, keepdims=True) + rng.normal(0, 0.1, (samples, 1))).astype("float32")
        out = keras.layers.Dense(1)
        loss, metrics = "mse", ["mae"]
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), out])
    model.compile(optimizer=OPTIMIZERS[optimizer](), loss=loss, metrics=metrics)
    fit = {"epochs": EPOCHS, "verbose": 0, "shuffle": False,
           "callbacks": [OutOfMemory((int(e), s) for e, s in
                                     (spot.split(":") for spot in args.oom))]}
    if "validation_split" in options:
        fit["validation_split"] = options["validation_split"]
    if options.get("sample_weight"):
        fit["sample_weight"] = rng.random(samples).astype("float32") * 2
    if classes:
        fit["class_weight"] = {0: 1.0, 1: 2.5, 2: 0.5}
    if kind in ("arrays", "tensors"):
        if kind == "tensors":
            x, y = tf.constant(x), tf.constant(y)
        for _ in range(options.get("fits", 1)):  # a second fit goes on where the first ended
            history = model.fit(x, y, batch_size=BATCH, **fit)
    elif kind == "generator":
        def batches():
            for start in range(0, samples, BATCH):
                yield x[start:start + BATCH], y[start:start + BATCH]

        fit["epochs"] = 1
        history = model.fit(batches(), **fit)
    else:
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH,
                                                               drop_remainder=kind == "dropped")
        if kind == "unknown":  # its number of batches is not known before an epoch ends
            data = data.filter(lambda *_: True)
        if options.get("validation"):
            fit["validation_data"] = tf.data.Dataset.from_tensor_slices(
                (x[:100], y[:100])).batch(BATCH)
        history = model.fit(data, **fit)
    return {"weights": [w.ravel().tolist() for w in model.get_weights()],
            "updates": int(model.optimizer.iterations),
            "history": history.history, "epochs": history.epoch,
            "accumulation": model.optimizer.gradient_accumulation_steps}


report = {name: case(name) for name in args.cases.split(",")}
with open(args.report, "w") as f:
    json.dump(report, f)
