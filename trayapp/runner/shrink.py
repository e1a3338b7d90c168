"""Training the same with a smaller batch: micro-batches and gradient accumulation.

The user's batch size is the effective batch. A job that does not fit trains micro-batches of
``batch / k`` and accumulates the gradients of ``k`` of them before each optimizer update, so
each update sees the same samples as before (Keras 3's ``gradient_accumulation_steps``: the
mean of the ``k`` gradients, which equals the gradient of the whole batch for a loss that is a
mean over the batch and a model without batch-dependent layers; batch normalisation sees
smaller batches, and a loss that is a sum over the batch changes scale).

Two things Keras does not do by itself, and this module does:

- ``optimizer.iterations`` under accumulation is the micro-step counter divided by ``k``, and a
  learning-rate schedule is evaluated on the micro-step counter. Switching ``k`` during training
  rescales the counter at an update boundary (so ``iterations`` keeps counting updates) and
  evaluates the user's schedule on updates (``UpdateSchedule``), so the learning rate follows the
  curve it follows without shrinking.
- The accumulators are optimizer variables: a checkpoint saved with them restores only into an
  optimizer that has them (Keras otherwise skips the whole optimizer state with a warning), so a
  resumed job sets its accumulation before restoring.

Keras 2 (``tf.keras`` of TensorFlow <= 2.15) has no accumulation: there, shrinking would change
the training, and ``set_accumulation`` refuses (``NoAccumulation``).

Keras is passed in: the runner cannot import it (the script chooses which Keras it uses).
"""

MAX_ACCUMULATION = 1024


class NoAccumulation(Exception):
    """The optimizer cannot accumulate gradients (Keras 2): a smaller batch would change the
    training."""


def accumulation(optimizer):
    """The optimizer's accumulation steps (1 without)."""
    return int(getattr(optimizer, "gradient_accumulation_steps", None) or 1)


def can_accumulate(optimizer):
    return hasattr(optimizer, "gradient_accumulation_steps") and hasattr(optimizer, "_iterations")


def update_schedule(keras, schedule, k):
    """The user's learning-rate schedule, evaluated on optimizer updates (micro-steps // k)."""
    base = keras.optimizers.schedules.LearningRateSchedule
    ops = keras.ops

    class UpdateSchedule(base):
        """``inner`` on the number of updates: Keras evaluates a schedule on micro-steps."""

        def __init__(self, inner, steps):
            self.inner = inner
            self.steps = int(steps)

        def __call__(self, step):
            return self.inner(ops.floor_divide(step, self.steps))

        def get_config(self):
            return {"inner": keras.saving.serialize_keras_object(self.inner),
                    "steps": self.steps}

    return UpdateSchedule(schedule, k)


def _user_schedule(optimizer):
    lr = getattr(optimizer, "_learning_rate", None)
    return getattr(lr, "inner", lr) if hasattr(lr, "steps") and hasattr(lr, "inner") else lr


def set_accumulation(keras, optimizer, k):
    """Make ``optimizer`` accumulate ``k`` micro-batches per update (``k`` = 1: none), at an
    update boundary (between two updates, where the accumulators are empty). Built or not:
    an unbuilt optimizer makes its accumulators when Keras builds it.

    Raises NoAccumulation (Keras 2) and ValueError for a ``k`` out of range. The model's
    compiled train function must be rebuilt after (``model.make_train_function(force=True)``)."""
    k = int(k)
    if not 1 <= k <= MAX_ACCUMULATION:
        raise ValueError(f"accumulation steps must be 1 to {MAX_ACCUMULATION}, not {k}")
    if not can_accumulate(optimizer):
        raise NoAccumulation(
            "this Keras has no gradient accumulation (Keras 2): a smaller batch would change "
            "the training")
    old = accumulation(optimizer)
    if k == old:
        return
    updates = int(optimizer._iterations.numpy()) // old
    optimizer.gradient_accumulation_steps = k if k > 1 else None
    if getattr(optimizer, "built", False):
        _make_accumulators(optimizer)
    optimizer._iterations.assign(updates * k)
    schedule = _user_schedule(optimizer)
    base = keras.optimizers.schedules.LearningRateSchedule
    if isinstance(schedule, base):
        optimizer._learning_rate = update_schedule(keras, schedule, k) if k > 1 else schedule


def _make_accumulators(optimizer):
    """The accumulator variables of a built optimizer (made once; zeroed when reused)."""
    existing = getattr(optimizer, "_accumulated_gradients", None)
    if existing:
        for acc in existing:
            acc.assign(acc * 0)
        return
    optimizer._accumulated_gradients = [
        optimizer.add_variable_from_reference(v, name="gradient_accumulator")
        for v in optimizer._trainable_variables
    ]


def micro_batch(batch, k):
    """The micro-batch of effective batch ``batch`` accumulated ``k`` times."""
    return max(1, int(batch) // int(k))


def plan_halving(batch, k, floor):
    """(micro-batch, accumulation) after one more halving, or None below ``floor`` (or when the
    batch cannot be split evenly any further: the effective batch must stay the same)."""
    new_k = int(k) * 2
    if int(batch) % new_k:
        return None
    micro = int(batch) // new_k
    if micro < max(1, int(floor)):
        return None
    return micro, new_k


# -- what can be re-batched --------------------------------------------------------------------

ARRAYS = "arrays"
DATASET = "dataset"


def input_kind(x):
    """``ARRAYS`` (arrays or tensors, batched by fit's ``batch_size``), ``DATASET`` (a
    ``tf.data.Dataset``, re-batched), or None with the reason (a PyDataset, a generator, or
    anything else that makes its own batches), as (kind, reason)."""
    module = type(x).__module__ or ""
    name = type(x).__name__
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return ARRAYS, ""
    if isinstance(x, (list, tuple, dict)) and x:
        values = x.values() if isinstance(x, dict) else x
        if all(hasattr(v, "shape") and hasattr(v, "dtype") for v in values):
            return ARRAYS, ""
    if "tensorflow" in module and hasattr(x, "unbatch") and hasattr(x, "element_spec"):
        return DATASET, ""
    if hasattr(x, "__getitem__") and hasattr(x, "__len__") and hasattr(x, "on_epoch_end"):
        return None, f"a {name} (PyDataset) makes its own batches: it cannot shrink"
    if hasattr(x, "__next__") or hasattr(x, "send"):
        return None, "a generator makes its own batches: it cannot shrink"
    return None, f"input of type {name} cannot be re-batched: it cannot shrink"


def _batch_dim(spec):
    """The static batch dimension of a dataset element (None when unknown or ragged)."""
    shape = getattr(spec, "shape", None)
    if shape is not None:
        dims = list(shape)
        return dims[0] if dims else None
    parts = spec.values() if isinstance(spec, dict) else spec
    for part in parts if isinstance(parts, (list, tuple)) else list(parts):
        found = _batch_dim(part)
        if found is not None:
            return found
    return None


def rebatch(dataset, micro):
    """``dataset`` (a batched ``tf.data.Dataset``) in batches of ``micro``, the samples in the
    same order; a dataset whose batch dimension is static (made with ``drop_remainder=True``)
    keeps dropping its remainder. Its number of batches stays known to Keras when it was known
    (for a dataset with a short last batch, that batch is read once to count it)."""
    micro = int(micro)
    drop = _batch_dim(dataset.element_spec) is not None
    small = dataset.unbatch().batch(micro, drop_remainder=drop)
    batches = int(dataset.cardinality())
    if drop or batches <= 0 or int(small.cardinality()) >= 0:
        return small
    full = int(_batch_size(next(iter(dataset.take(1)))))
    last = int(_batch_size(next(iter(dataset.skip(batches - 1).take(1)))))
    count = (batches - 1) * -(-full // micro) + -(-last // micro)
    return small.apply(_assert_cardinality(count))


def _batch_size(element):
    if hasattr(element, "shape"):
        return element.shape[0]
    parts = element.values() if isinstance(element, dict) else element
    return _batch_size(next(iter(parts)))


def _assert_cardinality(count):
    import tensorflow as tf  # the job's own TensorFlow, already imported by its dataset

    return tf.data.experimental.assert_cardinality(count)
