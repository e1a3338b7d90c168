"""A small Keras job that grabs BUFFER_MB of memory at the end of epoch 2, once (a marker file
remembers it), so the guard parks it; relaunched, it trains on without the buffer.

    python keras_hog.py EPOCHS MARKER_FILE EPOCH_LOG BUFFER_MB

Every epoch that begins appends "<pid> <epoch>" to EPOCH_LOG, so a test can tell which
epochs each launch trained.
"""

import os
import sys
import time

import keras
import numpy as np

epochs = int(sys.argv[1])
marker = sys.argv[2]
epoch_log = sys.argv[3]
buffer_mb = int(sys.argv[4])
PAGE = 4096


class Hog(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        with open(epoch_log, "a") as f:
            f.write(f"{os.getpid()} {epoch + 1}\n")

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.05)

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            n = buffer_mb << 20
            self.buffer = bytearray(n)
            self.buffer[::PAGE] = b"\x01" * ((n + PAGE - 1) // PAGE)
            print(f"holding {buffer_mb} MiB", flush=True)


rng = np.random.default_rng(0)
x = rng.normal(size=(160, 4)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer="adam", loss="binary_crossentropy")
model.fit(x, y, batch_size=8, epochs=epochs, verbose=0, callbacks=[Hog()])
print("training done", flush=True)
