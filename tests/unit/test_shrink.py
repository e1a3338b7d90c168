"""Shrinking keeps the training: micro-batches with gradient accumulation give the weights of
the full batch (real Keras 3 on tensorflow-cpu)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, List

import pytest

from trayapp.runner import shrink

pytestmark = pytest.mark.tensorflow

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
np = pytest.importorskip("numpy")
keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

SAMPLES, FEATURES, BATCH = 256, 8, 32


def data() -> Any:
    rng = np.random.default_rng(1)
    x = rng.random((SAMPLES, FEATURES), dtype=np.float32)
    return x, x.sum(axis=1, keepdims=True) + rng.normal(0, 0.1, (SAMPLES, 1)).astype("float32")


def model(schedule: bool = True, optimizer: str = "adam") -> Any:
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1)])
    lr: Any = 0.02
    if schedule:
        lr = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=3, decay_rate=0.5)
    opt = keras.optimizers.Adam(lr) if optimizer == "adam" else keras.optimizers.SGD(lr, 0.9)
    m.compile(optimizer=opt, loss="mse")
    return m


def max_diff(a: List[Any], b: List[Any]) -> float:
    return max(float(np.abs(p - q).max()) for p, q in zip(a, b))


def fit(m: Any, x: Any, y: Any, batch: int, epochs: int, initial: int = 0) -> None:
    m.fit(x, y, batch_size=batch, epochs=epochs, initial_epoch=initial, shuffle=False, verbose=0)


@pytest.fixture(scope="module")
def full() -> Any:
    x, y = data()
    m = model()
    fit(m, x, y, BATCH, 3)
    return m


@pytest.mark.parametrize("k", [2, 4])
def test_micro_batches_from_the_start_give_the_weights_of_the_full_batch(full: Any,
                                                                         k: int) -> None:
    x, y = data()
    m = model()
    shrink.set_accumulation(keras, m.optimizer, k)  # not built yet: Keras makes the accumulators
    fit(m, x, y, BATCH // k, 3)
    assert max_diff(full.get_weights(), m.get_weights()) < 1e-5
    assert int(m.optimizer.iterations) == int(full.optimizer.iterations) == 3 * SAMPLES // BATCH


def test_shrinking_in_the_middle_keeps_the_updates_and_the_schedule(full: Any) -> None:
    x, y = data()
    m = model()
    fit(m, x, y, BATCH, 1)
    shrink.set_accumulation(keras, m.optimizer, 2)
    m.make_train_function(force=True)
    fit(m, x, y, BATCH // 2, 2, initial=1)
    shrink.set_accumulation(keras, m.optimizer, 4)  # and again
    m.make_train_function(force=True)
    fit(m, x, y, BATCH // 4, 3, initial=2)
    assert max_diff(full.get_weights(), m.get_weights()) < 1e-5
    assert int(m.optimizer.iterations) == int(full.optimizer.iterations)
    assert float(m.optimizer.learning_rate) == pytest.approx(float(full.optimizer.learning_rate))


def test_without_the_update_schedule_the_training_would_differ(full: Any) -> None:
    """What ``UpdateSchedule`` is for: Keras evaluates a schedule on micro-steps."""
    x, y = data()
    m = model()
    fit(m, x, y, BATCH, 1)
    opt = m.optimizer
    opt.gradient_accumulation_steps = 2
    opt._accumulated_gradients = [opt.add_variable_from_reference(v, name="gradient_accumulator")
                                  for v in opt._trainable_variables]
    opt._iterations.assign(int(opt._iterations.numpy()) * 2)
    m.make_train_function(force=True)
    fit(m, x, y, BATCH // 2, 3, initial=1)
    assert max_diff(full.get_weights(), m.get_weights()) > 1e-3


def test_sgd_with_momentum_and_a_constant_rate_trains_the_same() -> None:
    x, y = data()
    a, b = model(schedule=False, optimizer="sgd"), model(schedule=False, optimizer="sgd")
    fit(a, x, y, BATCH, 2)
    fit(b, x, y, BATCH, 1)
    shrink.set_accumulation(keras, b.optimizer, 2)
    b.make_train_function(force=True)
    fit(b, x, y, BATCH // 2, 2, initial=1)
    assert max_diff(a.get_weights(), b.get_weights()) < 1e-5


def test_a_checkpoint_with_accumulators_restores_into_an_optimizer_set_up_alike(
        full: Any, tmp_path: Path) -> None:
    x, y = data()
    m = model()
    fit(m, x, y, BATCH, 1)
    shrink.set_accumulation(keras, m.optimizer, 2)
    m.make_train_function(force=True)
    fit(m, x, y, BATCH // 2, 2, initial=1)
    path = str(tmp_path / "latest.weights.h5")
    m.save_weights(path)

    plain = model()
    plain.optimizer.build(plain.trainable_variables)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        plain.load_weights(path)
    assert any("Skipping variable loading for optimizer" in str(w.message) for w in seen), \
        "Keras drops the optimizer's state silently but for a warning: set it up first"

    again = model()
    again.optimizer.build(again.trainable_variables)
    shrink.set_accumulation(keras, again.optimizer, 2)
    again.load_weights(path)
    fit(again, x, y, BATCH // 2, 3, initial=2)
    assert max_diff(full.get_weights(), again.get_weights()) < 1e-5


def test_keras_2_optimizers_are_refused_with_the_reason() -> None:
    class Keras2Optimizer:  # what tf.keras <= 2.15 optimizers lack
        pass

    with pytest.raises(shrink.NoAccumulation, match="would change the training"):
        shrink.set_accumulation(keras, Keras2Optimizer(), 2)


@pytest.mark.parametrize("k", [0, -1, shrink.MAX_ACCUMULATION + 1])
def test_accumulation_out_of_range_is_refused(k: int) -> None:
    with pytest.raises(ValueError, match="accumulation steps"):
        shrink.set_accumulation(keras, model().optimizer, k)


@pytest.mark.parametrize("batch,k,floor,expected", [
    (256, 1, 8, (128, 2)), (256, 2, 8, (64, 4)), (16, 1, 8, (8, 2)), (16, 2, 8, None),
    (24, 4, 1, (3, 8)), (24, 8, 1, None),  # 24 / 16 is not whole: the effective batch would change
    (1, 1, 1, None),
])
def test_halving_stops_at_the_floor_and_keeps_the_batch_whole(batch: int, k: int, floor: int,
                                                               expected: Any) -> None:
    assert shrink.plan_halving(batch, k, floor) == expected


def test_input_kinds() -> None:
    x, y = data()
    assert shrink.input_kind(x)[0] == shrink.ARRAYS
    assert shrink.input_kind({"a": x})[0] == shrink.ARRAYS
    assert shrink.input_kind(tf.data.Dataset.from_tensor_slices((x, y)).batch(8))[0] == \
        shrink.DATASET

    class Seq(keras.utils.PyDataset):
        def __len__(self) -> int:
            return 1

        def __getitem__(self, i: int) -> Any:
            return x, y

    kind, why = shrink.input_kind(Seq())
    assert kind is None and "PyDataset" in why and "cannot shrink" in why
    kind, why = shrink.input_kind(iter([(x, y)]))
    assert kind is None and "generator" in why


@pytest.mark.parametrize("drop", [False, True])
def test_a_dataset_is_rebatched_in_order_keeping_drop_remainder(drop: bool) -> None:
    x, y = data()
    ds = tf.data.Dataset.from_tensor_slices((x[:100], y[:100])).batch(32, drop_remainder=drop)
    small = shrink.rebatch(ds, 16)
    before = np.concatenate([b[0].numpy() for b in ds])
    after = np.concatenate([b[0].numpy() for b in small])
    assert np.array_equal(before, after)
    sizes = [int(b[0].shape[0]) for b in small]
    assert sizes == ([16] * 6 if drop else [16] * 6 + [4])
    assert (small.element_spec[0].shape[0] is not None) == drop
    assert int(small.cardinality()) == len(sizes)


def test_a_rebatched_dataset_trains_the_same(full: Any) -> None:
    x, y = data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    m = model()
    shrink.set_accumulation(keras, m.optimizer, 2)
    m.fit(shrink.rebatch(ds, BATCH // 2), epochs=3, shuffle=False, verbose=0)
    assert max_diff(full.get_weights(), m.get_weights()) < 1e-5


class _Flush(keras.callbacks.Callback):
    """What the runner's FitRun does for ExactSteps: the train function flushes after the
    epoch's last micro-step."""

    def __init__(self, exact: Any) -> None:
        super().__init__()
        self.exact = exact
        self.step: Any = None

    def on_train_begin(self, logs: Any = None) -> None:
        steps = self.params.get("steps")
        self.exact.wrap_train_function(lambda: steps is not None and self.step == steps - 1)

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.step = batch


@pytest.mark.parametrize("samples", [250, 248, 20], ids=["short-micro-batch",
                                                        "whole-micro-batches", "one-batch"])
@pytest.mark.parametrize("k", [2, 4])
def test_a_short_last_batch_is_one_update_with_the_gradient_of_its_samples(samples: int,
                                                                           k: int) -> None:
    """250 samples at batch 32: 7 batches and one of 26 (micro-batches of 16: 16 + 10; of 8:
    8 + 8 + 8 + 2); 248: one of 24 (whole micro-batches, fewer than k when k is 4); 20: one
    batch, shorter than the batch."""
    x, y = data()
    x, y = x[:samples], y[:samples]
    full = model()
    fit(full, x, y, BATCH, 2)
    m = model()
    shrink.set_accumulation(keras, m.optimizer, k)
    exact = shrink.ExactSteps(keras, tf, m)
    exact.arm(BATCH // k, k)
    m.fit(x, y, batch_size=BATCH // k, epochs=2, shuffle=False, verbose=0,
          callbacks=[_Flush(exact)])
    assert int(m.optimizer.iterations) == int(full.optimizer.iterations) == 2 * -(-samples //
                                                                                  BATCH)
    assert max_diff(full.get_weights(), m.get_weights()) < 1e-5
    exact.disarm()
    assert "train_step" not in vars(m) and m.train_function is None


def test_without_exact_steps_the_short_last_batch_changes_the_training() -> None:
    """What ``ExactSteps`` is for: Keras's own accumulation on a short last batch."""
    x, y = data()
    x, y = x[:248], y[:248]  # 7 batches and one of 24: 3 micro-batches of 8 where 4 make one
    full, m = model(), model()
    fit(full, x, y, BATCH, 2)
    shrink.set_accumulation(keras, m.optimizer, 4)
    fit(m, x, y, BATCH // 4, 2)
    assert (int(m.optimizer.iterations), int(full.optimizer.iterations)) == (15, 16)
    assert max_diff(full.get_weights(), m.get_weights()) > 1e-3
