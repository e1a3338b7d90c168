"""A fit on a PyDataset (it makes its own batches): one epoch of 4 batches of 16.

Usage: pydataset_fit.py
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402


class Batches(keras.utils.PyDataset):
    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(0)
        self.x = rng.random((64, 8), dtype=np.float32)
        self.y = self.x.sum(axis=1, keepdims=True)

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return self.x[i * 16:(i + 1) * 16], self.y[i * 16:(i + 1) * 16]


model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(Batches(), epochs=1, verbose=0)
print("trained", int(model.optimizer.iterations))
