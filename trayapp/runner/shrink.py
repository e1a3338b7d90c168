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

import sys

from . import forecast

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
        to_update_boundary(optimizer)
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


def to_update_boundary(optimizer):
    """Drop a half-accumulated update (after an error in the middle of one): the counter goes
    back to the last update and the accumulators are emptied, so training repeats those
    micro-batches instead of counting them twice."""
    k = accumulation(optimizer)
    if k <= 1:
        return
    optimizer._iterations.assign((int(optimizer._iterations.numpy()) // k) * k)
    for acc in getattr(optimizer, "_accumulated_gradients", None) or ():
        acc.assign(acc * 0)


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


# -- an out-of-memory error in fit() -------------------------------------------------------------


def is_oom(error):
    """An out-of-memory error of TensorFlow (``ResourceExhaustedError``, "OOM when allocating")
    or of the host (``MemoryError``, numpy's included)."""
    if isinstance(error, MemoryError):
        return True
    return type(error).__name__ == "ResourceExhaustedError" or "OOM when allocating" in str(error)


def oom_text(error):
    """What ran out, in one line: TensorFlow's "OOM when allocating tensor with shape[...]",
    else the error's first line."""
    for line in str(error).splitlines():
        if "OOM when allocating" in line:
            line = line.strip()
            return line.split(" and type ")[0] if " and type " in line else line[:200]
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else type(error).__name__


def release_memory():
    """Give back what the failed step held: its frames are gone once the error is dropped;
    collect their cycles, and hand freed heap pages back to the system (glibc), so the smaller
    step finds the room the bigger one had (measured: the difference between an abort on the
    next thread TensorFlow starts and a retry that trains, under an address-space limit)."""
    import gc  # only after an out-of-memory error

    gc.collect()
    try:
        import ctypes  # only after an out-of-memory error

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def make_atomic(tf, optimizer):
    """Make each optimizer step all or nothing: no variable is updated (nor the step counted)
    before every gradient of the step exists. Without it, TensorFlow updates the variables
    whose gradients are ready while it still computes the others, so an out-of-memory error in
    an earlier layer's gradient leaves the later layers updated and the earlier ones not
    (measured on tensorflow-cpu: the last Dense layer updated, the two before not, the counter
    advanced) and no training can go on from such weights. Returns True when patched now."""
    if getattr(optimizer, "_headroom_atomic", False) or not hasattr(optimizer, "apply"):
        return False
    original = optimizer.apply

    def apply(grads, trainable_variables=None):
        grads = list(grads)
        tensors = [g for g in grads if isinstance(g, tf.Tensor)]
        with tf.control_dependencies(tensors):
            grads = [tf.identity(g) if isinstance(g, tf.Tensor) else g for g in grads]
            return original(grads, trainable_variables)

    optimizer.apply = apply
    optimizer._headroom_atomic = True
    return True


def _gpus_visible():
    return bool(forecast.gpu_names(sys.modules.get("tensorflow")))


class Shrinker:
    """What one hooked ``fit()`` call can do on an out-of-memory error: the effective batch, the
    current micro-batch and accumulation, and the input it re-batches."""

    def __init__(self, keras, session, model, bound, keras3):
        self.keras = keras
        self.session = session
        self.model = model
        self.bound = bound
        options = session.options
        self.enabled = options["on_oom"] in ("shrink", "smaller-batch")
        # Asked for a smaller batch where there is no accumulation, changing the training.
        self.changing = options["on_oom"] == "smaller-batch"
        self.floor = options["min_batch"]
        self.keras3 = keras3
        self.x = bound.arguments.get("x")
        self.kind, self.why = input_kind(self.x) if self.x is not None else (None, "no input")
        self.k = accumulation(getattr(model, "optimizer", None))
        self.batch = None  # the effective batch, known once needed
        self.steps_per_epoch = bound.arguments.get("steps_per_epoch")
        self.tf_backend = False  # set by prepare()
        self.plain_batch = None  # the batch trained without accumulation, once halved so

    def prepare(self, tf_backend):
        """At the start of the fit: say when it cannot shrink; else, on a GPU (where training
        runs out of memory: its VRAM), make its steps atomic, so an out-of-memory error leaves
        the weights of the last whole update. On the CPU alone the atomic step costs a small
        model about a fifth of its speed (measured: bench_shrink) for an error that a host
        rarely raises (the kernel's OOM killer ends a process instead): there it is made
        atomic after a first out-of-memory error, so later ones leave whole updates."""
        self.tf_backend = tf_backend
        if not self.enabled:
            return
        if self.kind is None and self.x is not None:
            self.session.note("info", f"{self.why}; an out-of-memory error ends the job")
            return
        if self.refusal() is None and _gpus_visible():
            self.atomic()

    def atomic(self):
        """Make the fit's optimizer steps atomic (``make_atomic``), once."""
        tf = sys.modules.get("tensorflow")
        optimizer = getattr(self.model, "optimizer", None)
        if self.tf_backend and tf is not None and optimizer is not None:
            if make_atomic(tf, optimizer):
                self.model.train_function = None  # traced again, with the atomic step

    def effective_batch(self, read=True):
        """The batch each optimizer update sees; a dataset without a static batch dimension
        has one batch read to know it (``read`` False: None instead)."""
        if self.batch is None:
            if self.kind == ARRAYS:
                self.batch = int(self.bound.arguments.get("batch_size") or 32) * self.k
            elif self.kind == DATASET:
                dim = _batch_dim(self.x.element_spec)
                if dim is None and not read:
                    return None
                self.batch = int(dim or _batch_size(next(iter(self.x.take(1))))) * self.k
        return self.batch

    def micro(self):
        """The micro-batch trained now, when known without reading the input (else None)."""
        batch = self.effective_batch(read=False)
        return micro_batch(batch, self.k) if batch else None

    def refusal(self):
        """Why this fit cannot shrink, or None."""
        if not self.enabled:
            return "--on-oom stop"
        if not self.keras3 or not can_accumulate(getattr(self.model, "optimizer", None)):
            return ("Keras 2 has no gradient accumulation: a smaller batch would change the "
                    "training (--on-oom smaller-batch allows it)")
        if self.kind is None:
            return self.why
        if int(getattr(self.model, "steps_per_execution", 1) or 1) > 1:
            return "steps_per_execution > 1 (a failed call may have trained some of its steps)"
        return None

    def apply(self, k, switch=True):
        """Train micro-batches of ``effective / k`` accumulated ``k`` times from the next
        ``fit()`` attempt on (``k`` after a halving, or as a checkpoint recorded it). Without
        ``switch`` only the input is re-batched: the optimizer is switched later (once a
        checkpoint saved at another accumulation is restored)."""
        batch = self.effective_batch()
        micro = micro_batch(batch, k)
        if switch:
            self.switch(k)
        self.atomic()
        if self.kind == ARRAYS:
            self.bound.arguments["batch_size"] = micro
        else:
            self.bound.arguments["x"] = rebatch(self.x, micro) if k > 1 else self.x
        if self.steps_per_epoch:
            self.bound.arguments["steps_per_epoch"] = int(self.steps_per_epoch) * k
        self.model.train_function = None  # compiled for the old optimizer: built again
        return micro

    def switch(self, k):
        """The optimizer accumulates ``k`` micro-batches an update from now on (the input is
        left as it is: for a checkpoint the next process restores)."""
        optimizer = self.model.optimizer
        if not getattr(optimizer, "built", False) and getattr(self.model, "built", False):
            # Built first and the accumulators added after, always: a checkpoint holds the
            # optimizer's variables in the order they were made, and one saved after a shrink
            # in the middle of training has them after the optimizer's own.
            optimizer.build(self.model.trainable_variables)
        set_accumulation(self.keras, optimizer, k)
        self.k = k

    def plain_ok(self):
        """A smaller batch without accumulation may be trained: asked for (``--on-oom
        smaller-batch``) where the optimizer cannot accumulate (Keras 2), on input that can be
        re-batched, one step a call."""
        return (self.enabled and self.changing and self.kind is not None
                and not (self.keras3 and can_accumulate(getattr(self.model, "optimizer", None)))
                and int(getattr(self.model, "steps_per_execution", 1) or 1) <= 1)

    def halve_plain(self):
        """The next batch without accumulation (half the one trained), or None below the
        floor."""
        batch = self.plain_batch or self.effective_batch()
        half = int(batch) // 2
        return half if half >= max(1, self.floor) else None

    def apply_plain(self, batch):
        """Train batches of ``batch`` from the next ``fit()`` attempt on (no accumulation: the
        training changes). Returns how many of them make one batch trained before."""
        old = int(self.plain_batch or self.effective_batch())
        if self.kind == ARRAYS:
            self.bound.arguments["batch_size"] = batch
        else:
            self.bound.arguments["x"] = rebatch(self.x, batch)
        ratio = max(1, old // batch)
        if self.steps_per_epoch:
            self.bound.arguments["steps_per_epoch"] = int(self.steps_per_epoch) * (
                int(self.effective_batch()) // batch)
        self.plain_batch = batch
        self.model.train_function = None  # traced again for the new batch
        return ratio

    def halve(self):
        """(micro-batch, accumulation) of the next halving, or None (the floor, or a batch that
        does not split evenly)."""
        return plan_halving(self.effective_batch(), self.k, self.floor)
