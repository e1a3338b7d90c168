"""The training metrics' state (Keras 3: each metric's variables, a mean's total and count), kept
so that an epoch trained again from inside it reports its metrics over the whole epoch.

- A checkpoint saved inside an epoch keeps the state as it is (``state``); the resumed epoch
  puts it back as it begins (``put``), its metrics building first (``build``).
- After an out-of-memory error the state as it is may count part of the failed step (Keras
  updates the loss's mean before the gradient is taken). ``Keeper`` copies the state, inside
  the train step, after each step that ends an optimizer update (every step without
  accumulation): after the error, that copy is the state of the batches done, which training
  in place or a relaunch goes on from.

What cannot be kept: a metric whose state is not its variables (one that keeps Python values)
or whose variables change in number; there, the epoch's metrics cover the batches trained after
the restart, and the runner says so.

Stdlib only: TensorFlow is the job's own.
"""


def state(model):
    """{metric name: [its variables' values]} of the training metrics, {} when one of them
    cannot be read."""
    out = {}
    try:
        for metric in model.metrics:
            values = [v.numpy().tolist() for v in metric.variables]
            if values:
                out[metric.name] = values
    except Exception:  # a metric whose state is not its variables
        return {}
    return out


def build(model, shrinker):
    """Make the compiled metrics' variables now, as Keras does under a distribution strategy
    (the TensorFlow backend otherwise makes them as the first step is traced), so that a state
    can be put in them (or copied) as the epoch begins."""
    metrics = getattr(model, "_compile_metrics", None)
    if (
        metrics is None
        or getattr(metrics, "built", True)
        or shrinker is None
        or not hasattr(model, "_symbolic_build")
    ):
        return
    try:
        batch = shrinker.one_batch()
        if batch is not None:
            model._symbolic_build(data_batch=batch)
    except Exception:  # the epoch's metrics then cover the batches trained after the restart
        pass


def put(model, saved):
    """The metrics as ``saved`` holds them; False when one of them could not be."""
    whole = True
    for metric in getattr(model, "metrics", None) or ():
        values = saved.get(metric.name)
        variables = list(metric.variables)
        if not values and not variables:
            continue
        if values is None or len(values) != len(variables):
            whole = False
            continue
        try:
            for variable, value in zip(variables, values):
                variable.assign(value)
        except Exception:
            whole = False
    return whole


class Keeper:
    """A copy of the metrics' state as each optimizer update ends, made inside the train step
    (a few assignments in the graph: nothing read back to Python on a step)."""

    def __init__(self, tf, model):
        self.tf = tf
        self.model = model
        self.pairs = None  # [(metric name, [(variable, copy)])]
        self._train_step = None  # (the model's train_step, whether it was the instance's)

    def install(self, shrinker):
        """Copy the state from the next step on; False when the metrics' variables cannot be
        had now (then nothing is kept)."""
        tf, model = self.tf, self.model
        build(model, shrinker)
        try:
            pairs = []
            for metric in model.metrics:
                variables = list(metric.variables)
                pairs.append(
                    (
                        metric.name,
                        [
                            (v, tf.Variable(tf.zeros_like(v.value), trainable=False))
                            for v in variables
                        ],
                    )
                )
        except Exception:  # a metric without variables of its own, or not built yet
            return False
        compiled = getattr(model, "_compile_metrics", None)
        if compiled is not None and not getattr(compiled, "built", True):
            return False  # its variables come with the first trace: their copies would not
        self.pairs = pairs
        own = model.train_step
        keeper = self

        def train_step(data):
            logs = own(data)
            keeper._copy()  # after the step's own updates (the graph keeps their order)
            return logs

        self._train_step = (own, "train_step" in vars(model), train_step)
        model.train_step = train_step
        model.train_function = None  # traced again, with the copy
        return True

    def _copy(self):
        """In the traced step, after it: the copies take the metrics' values when the step
        ended an update (its optimizer's counter of micro-steps is a multiple of its
        accumulation)."""
        tf = self.tf
        optimizer = self.model.optimizer
        k = int(getattr(optimizer, "gradient_accumulation_steps", None) or 1)
        ended = None
        if k > 1:
            ended = tf.equal(tf.math.floormod(optimizer._iterations.value, k), 0)
        for _name, pairs in self.pairs:
            for variable, copy in pairs:
                value = variable.value
                copy.assign(value if ended is None else tf.where(ended, value, copy))

    def current(self):
        """Installed, its step still the model's, and copying the metrics the model has now
        (a fit() after another reuses it: no trace again; after a compile it is made anew)."""
        if (
            self._train_step is None
            or self.pairs is None
            or vars(self.model).get("train_step") is not self._train_step[2]
        ):
            return False
        try:
            now = [id(v) for metric in self.model.metrics for v in metric.variables]
        except Exception:
            return False
        return now == [id(v) for _name, pairs in self.pairs for v, _copy in pairs]

    def state(self):
        """The state as the last whole update ended, in ``state``'s form; {} without copies."""
        if self.pairs is None:
            return {}
        try:
            return {
                name: [copy.numpy().tolist() for _v, copy in pairs]
                for name, pairs in self.pairs
                if pairs
            }
        except Exception:
            return {}

    def uninstall(self):
        """The model's own train step again."""
        if self._train_step is None:
            return
        own, instance, ours = self._train_step
        self._train_step = None
        if vars(self.model).get("train_step") is not ours:
            return  # another step stands on ours now: left as it is
        if instance:
            self.model.train_step = own
        else:
            vars(self.model).pop("train_step", None)
        self.model.train_function = None
