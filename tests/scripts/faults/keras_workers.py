"""A Keras job whose data comes from a PyDataset with worker processes (multiprocessing), so the
job is a tree: the training process and its workers.

    python keras_workers.py EPOCHS STEPS DELAY
"""

import sys
import time

import keras
import numpy as np

epochs, steps, delay = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])


class Batches(keras.utils.PyDataset):
    def __init__(self):
        super().__init__(workers=2, use_multiprocessing=True, max_queue_size=4)
        self.rng = np.random.default_rng(0)

    def __len__(self):
        return steps

    def __getitem__(self, i):
        time.sleep(delay)  # the workers do the slow part, as a real data pipeline would
        x = self.rng.normal(size=(8, 4)).astype("float32")
        return x, (x.sum(axis=1, keepdims=True) > 0).astype("float32")


model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer="adam", loss="binary_crossentropy")
model.fit(Batches(), epochs=epochs, verbose=0)
print("training done", flush=True)
