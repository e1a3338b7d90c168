"""A small Keras model trained on random data: EPOCHS epochs of STEPS batches, each batch made
slower by DELAY seconds so the tests can pause, park and stop it mid-epoch.

With a fifth argument GATE (a file), the first epoch holds at its second batch end until GATE
exists (it writes GATE.held when it starts waiting): a test asks for a pause, park or stop
while it holds, then opens the gate, and the request lands mid-epoch whatever the machine's
load. A run that finds GATE already there (a resumed one) does not hold."""

import os
import sys
import time

import keras
import numpy as np

epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
delay = float(sys.argv[3]) if len(sys.argv) > 3 else 0.02
gate = sys.argv[4] if len(sys.argv) > 4 else None


class Slow(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        if gate and self.batches == 2 and not os.path.exists(gate):
            open(gate + ".held", "w").close()
            while not os.path.exists(gate):
                time.sleep(0.02)
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
