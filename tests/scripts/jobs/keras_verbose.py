"""A small Keras model trained with Keras's own progress bar (verbose=1): EPOCHS epochs of STEPS
batches, each made slower by DELAY seconds, so the bar is redrawn many times per epoch."""

import sys
import time

import keras
import numpy as np

epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
delay = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05


class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(delay)


rng = np.random.default_rng(0)
x = rng.normal(size=(steps * 8, 4)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
model.fit(x, y, batch_size=8, epochs=epochs, verbose=1, callbacks=[Slow()])
print("training done", flush=True)
