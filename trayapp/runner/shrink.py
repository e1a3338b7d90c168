"""Training the same with a smaller batch: micro-batches and gradient accumulation.

The user's batch size is the effective batch. A job that does not fit trains micro-batches of
``batch / k`` and accumulates the gradients of ``k`` of them before each optimizer update, so
each update sees the same samples as before (Keras 3's ``gradient_accumulation_steps``: the
mean of the ``k`` gradients, which equals the gradient of the whole batch for a loss that is a
mean over the batch and a model without batch-dependent layers; batch normalisation sees
smaller batches, and a loss that is a sum over the batch changes scale).

The accumulation itself (setting ``k`` at an update boundary, the learning-rate schedule on
updates, every batch one update: ``ExactSteps``) is ``runner.accumulate``; its names are
re-exported here for the fit hook.

After an out-of-memory error, ``oom_site`` says where it happened (the host or a GPU, the
optimizer's update, a gradient), from which the fit hook decides whether training may go on in
this process or in a fresh one (``runner.relaunch``).

Keras 2 (``tf.keras`` of TensorFlow <= 2.15) has no accumulation: there, shrinking would change
the training, and ``set_accumulation`` refuses (``NoAccumulation``).

Keras is passed in: the runner cannot import it (the script chooses which Keras it uses).
"""

import re
import sys

from . import forecast, protocol, tfoptions
from .accumulate import EXACT_SCOPE, ExactSteps, accumulation, can_accumulate
from .accumulate import MAX_ACCUMULATION as MAX_ACCUMULATION
from .accumulate import NoAccumulation as NoAccumulation
from .accumulate import empty_at_boundary as empty_at_boundary
from .accumulate import micro_batch as micro_batch
from .accumulate import plan_halving as plan_halving
from .accumulate import set_accumulation as set_accumulation
from .accumulate import to_update_boundary as to_update_boundary

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


HOST = "host"
GPU = "gpu"
_NODE = (
    re.compile(r"\{\{node ([^}\s]+)\}\}"),
    re.compile(r"Detected at node '?([^'\s]+)'? defined"),
)
_GPU = re.compile(r"device:GPU:\d+|by allocator GPU_|by allocator gpu")
_HOST = re.compile(r"device:CPU:\d+|by allocator (cpu|mklcpu|cuda_host_bfc|gpu_host_bfc)")


class OomSite:
    """Where an out-of-memory error of ``fit()`` happened: ``device`` (``HOST``, ``GPU``, or
    None when the error does not say: raised by Python code), ``node`` (the graph node that
    failed, when known), ``in_update`` (the node is part of the optimizer's update: the weights
    or the optimizer's state may be half updated) and ``backward`` (a gradient: where steps are
    not atomic, updates of the layers whose gradients were ready may have been made)."""

    def __init__(self, device, node, in_update, backward):
        self.device = device
        self.node = node
        self.in_update = in_update
        self.backward = backward

    def __repr__(self):
        return (
            f"OomSite({self.device!r}, {self.node!r}, in_update={self.in_update}, "
            f"backward={self.backward})"
        )


def oom_site(error, optimizer=None):
    """The ``OomSite`` of ``error`` (an out-of-memory error, ``is_oom``), from what TensorFlow
    says: the device of the allocator that failed, and the node ("Detected at node ...")."""
    if isinstance(error, MemoryError):
        return OomSite(HOST, None, False, False)
    text = str(error)
    device = GPU if _GPU.search(text) else HOST if _HOST.search(text) else None
    node = None
    for pattern in _NODE:
        found = pattern.search(text)
        if found:
            node = found.group(1)
            break
    scopes = [EXACT_SCOPE]
    name = getattr(optimizer, "name", None)
    if isinstance(name, str) and name:
        scopes.append(name)
    parts = node.split("/") if node else []
    in_update = any(scope in parts[:-1] for scope in scopes)
    backward = any(part.startswith("gradient_tape") for part in parts[:-1])
    return OomSite(device, node, in_update, backward)


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
        self.enabled = options["on_oom"] in tfoptions.ON_OOM_SHRINKS
        # Asked for a smaller batch where there is no accumulation, changing the training.
        self.changing = options["on_oom"] == tfoptions.ON_OOM_SMALLER_BATCH
        self.floor = options["min_batch"]
        self.keras3 = keras3
        self.x = bound.arguments.get("x")
        self.kind, self.why = input_kind(self.x) if self.x is not None else (None, "no input")
        optimizer = getattr(model, "optimizer", None)
        self.k = accumulation(optimizer)
        # The optimizer accumulates as an earlier fit of the runner's shrank it: this fit's
        # batch is the effective batch, trained in micro-batches alike (a script's own
        # accumulation makes its batch the micro-batch).
        self.inherited = self.k > 1 and getattr(optimizer, "_headroom_accumulation", None) == self.k
        self.batch = None  # the effective batch, known once needed
        self.steps_per_epoch = bound.arguments.get("steps_per_epoch")
        self.tf_backend = False  # set by prepare()
        self.plain_batch = None  # the batch trained without accumulation, once halved so
        self.exact = None  # ExactSteps, once the fit trains micro-batches

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
            self.session.note(
                protocol.NOTE_INFO, f"{self.why}; an out-of-memory error ends the job"
            )
            return
        # A job relaunched after an out-of-memory error has had one: atomic from the start.
        relaunched = self.session.options.get("relaunch") is not None
        if self.refusal() is None and (_gpus_visible() or relaunched):
            self.atomic()
        batch = self.effective_batch(read=False) if self.refusal() is None else None
        if self.k > 1 and batch and not self.inherited:
            # The script's optimizer accumulates: its batch is the micro-batch.
            self._exact(micro_batch(batch, self.k), self.k)

    def atomic(self):
        """Make the fit's optimizer steps atomic (``make_atomic``), once."""
        tf = sys.modules.get("tensorflow")
        optimizer = getattr(self.model, "optimizer", None)
        if self.tf_backend and tf is not None and optimizer is not None:
            if make_atomic(tf, optimizer):
                self.model.train_function = None  # traced again, with the atomic step

    def is_atomic(self):
        """The fit's optimizer steps are atomic (``make_atomic``)."""
        return bool(getattr(getattr(self.model, "optimizer", None), "_headroom_atomic", False))

    def trusted(self, site):
        """The weights and the optimizer's state are those of the last whole update after an
        out-of-memory error at ``site`` (``OomSite``): the error was not in the optimizer's
        update, nor in a gradient of a step that is not atomic."""
        return not site.in_update and (self.is_atomic() or not site.backward)

    def effective_batch(self, read=True):
        """The batch each optimizer update sees; a dataset without a static batch dimension
        has one batch read to know it (``read`` False: None instead)."""
        if self.batch is None:
            times = 1 if self.inherited else self.k
            if self.kind == ARRAYS:
                self.batch = int(self.bound.arguments.get("batch_size") or 32) * times
            elif self.kind == DATASET:
                dim = _batch_dim(self.x.element_spec)
                if dim is None and not read:
                    return None
                self.batch = int(dim or _batch_size(next(iter(self.x.take(1))))) * times
        return self.batch

    def one_batch(self):
        """One sample of the fit's input, as (x, y, sample_weight) or the dataset's element, or
        None (input of another kind)."""
        args = self.bound.arguments
        if self.kind == ARRAYS:
            tree = self.keras.tree

            def cut(value):
                return None if value is None else tree.map_structure(lambda a: a[:1], value)

            return cut(args.get("x")), cut(args.get("y")), cut(args.get("sample_weight"))
        if self.kind == DATASET:
            return next(iter(self.x.take(1)))
        return None

    def micro(self):
        """The micro-batch trained now, when known without reading the input (else None)."""
        batch = self.effective_batch(read=False)
        return micro_batch(batch, self.k) if batch else None

    def refusal(self):
        """Why this fit cannot shrink, or None."""
        if not self.enabled:
            return "--on-oom stop"
        if not self.keras3 or not can_accumulate(getattr(self.model, "optimizer", None)):
            return (
                "Keras 2 has no gradient accumulation: a smaller batch would change the "
                "training (--on-oom smaller-batch allows it)"
            )
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
        self._exact(micro, k)
        if self.kind == ARRAYS:
            self.bound.arguments["batch_size"] = micro
        else:
            self.bound.arguments["x"] = rebatch(self.x, micro) if k > 1 else self.x
        if self.steps_per_epoch:
            self.bound.arguments["steps_per_epoch"] = int(self.steps_per_epoch) * k
        self.model.train_function = None  # compiled for the old optimizer: built again
        return micro

    def _exact(self, micro, k):
        """Every batch one update with the gradient of the whole batch (``ExactSteps``)."""
        tf = sys.modules.get("tensorflow")
        if self.exact is None and (k <= 1 or not self.tf_backend or tf is None):
            return
        if self.exact is None:
            self.exact = ExactSteps(self.keras, tf, self.model)
        self.exact.arm(micro, k)

    def flush_after(self, last_step):
        """Keras made the fit's train function: from now on it applies what waits at the end
        of an epoch (``ExactSteps.wrap_train_function``)."""
        if self.exact is not None:
            self.exact.wrap_train_function(last_step)

    def done(self):
        """The fit ended: the model's own train step again."""
        if self.exact is not None:
            self.exact.disarm()
            self.exact = None

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
        return (
            self.enabled
            and self.changing
            and self.kind is not None
            and not (self.keras3 and can_accumulate(getattr(self.model, "optimizer", None)))
            and int(getattr(self.model, "steps_per_execution", 1) or 1) <= 1
        )

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
                int(self.effective_batch()) // batch
            )
        self.plain_batch = batch
        self.model.train_function = None  # traced again for the new batch
        return ratio

    def halve(self):
        """(micro-batch, accumulation) of the next halving, or None (the floor, or a batch that
        does not split evenly)."""
        return plan_halving(self.effective_batch(), self.k, self.floor)
