"""A small Keras model trained on random data: EPOCHS epochs of STEPS batches, each batch made
slower by DELAY seconds so the tests can pause, park and stop it mid-epoch."""

import sys
import time

import keras
import numpy as np

epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
delay = float(sys.argv[3]) if len(sys.argv) > 3 else 0.02


class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(delay)


class Mark(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        print(f"epoch-begin {epoch + 1}", flush=True)


rng = np.random.default_rng(0)
x = rng.normal(size=(steps * 8, 4)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer="adam", loss="binary_crossentropy")
model.fit(x, y, batch_size=8, epochs=epochs, verbose=0, callbacks=[Slow(), Mark()])
print("training done", flush=True)
