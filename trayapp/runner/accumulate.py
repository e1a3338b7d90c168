"""Gradient accumulation: an optimizer that trains ``k`` micro-batches per update, set and
switched at an update boundary, and every batch of an epoch one update (``ExactSteps``).

Three things Keras does not do by itself, and this module does:

- ``optimizer.iterations`` under accumulation is the micro-step counter divided by ``k``, and a
  learning-rate schedule is evaluated on the micro-step counter. Switching ``k`` during training
  rescales the counter at an update boundary (so ``iterations`` keeps counting updates) and
  evaluates the user's schedule on updates (``UpdateSchedule``), so the learning rate follows the
  curve it follows without shrinking.
- The accumulators are optimizer variables: a checkpoint saved with them restores only into an
  optimizer that has them (Keras otherwise skips the whole optimizer state with a warning), so a
  resumed job sets its accumulation before restoring.
- Keras's mean of ``k`` micro-batch gradients is the gradient of the batch only for ``k`` equal
  micro-batches: an epoch's last, short batch has fewer, and a shorter last one. ``ExactSteps``
  makes every batch one update with the gradient of the whole batch.

Keras 2 has no accumulation: ``set_accumulation`` refuses (``NoAccumulation``). Keras and
TensorFlow are passed in: the runner cannot import them (the script chooses which it uses).
"""

EXACT_SCOPE = "headroom_exact"  # the name scope of ExactSteps's own ops (``shrink.oom_site``)

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
            return {"inner": keras.saving.serialize_keras_object(self.inner), "steps": self.steps}

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
            "the training"
        )
    old = accumulation(optimizer)
    optimizer._headroom_accumulation = k  # set by the runner, not by the script
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


def empty_at_boundary(optimizer):
    """At an update boundary (the counter a multiple of the accumulation) nothing waits for an
    update: empty the accumulators (a checkpoint saved after an out-of-memory error holds what
    the failed update had gathered; its micro-batches are trained again)."""
    k = accumulation(optimizer)
    if k <= 1 or int(optimizer._iterations.numpy()) % k:
        return
    for acc in getattr(optimizer, "_accumulated_gradients", None) or ():
        acc.assign(acc * 0)


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


# -- every batch of an epoch one update: the short last batch too ------------------------------


def _samples(keras, tf, data):
    """The number of samples of one batch of ``data`` (what Keras counts the loss with)."""
    x = keras.utils.unpack_x_y_sample_weight(data)[0]
    first = next(v for v in keras.tree.flatten(x) if v is not None)
    return tf.shape(first)[0]


def _scaled(tf, gradient, factor):
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(
            gradient.values * tf.cast(factor, gradient.values.dtype),
            gradient.indices,
            gradient.dense_shape,
        )
    return gradient * tf.cast(factor, gradient.dtype)


class ExactSteps:
    """Every batch of the user's one optimizer update with the gradient of the whole batch, the
    last, short batch of an epoch included.

    Keras accumulates ``k`` micro-batches and updates with the mean of their gradients: right for
    a batch of ``k`` equal micro-batches, wrong for the last batch of an epoch whose samples are
    fewer than the batch (most datasets): its micro-batches are fewer than ``k`` (Keras would
    apply them with the next epoch's, or never) and the last of them is shorter (its mean
    gradient would count as much as a whole micro-batch's). The input is trained in micro-batches
    of ``micro`` (``batch / k``) in the order of the batches, so only the epoch's last micro-batch
    can be short, and every micro-batch before it in its update is whole. Then, inside the
    optimizer's ``apply``:

    - each micro-step's gradient is weighted by its share of a whole micro-batch (``n / micro``:
      1 but for a short one);
    - a short micro-batch ends its update there: the counter is set to the update's last
      micro-step, so Keras updates now, and the gradient handed to Keras is the one that turns
      Keras's ``(g + accumulated) / k`` into the mean over the ``j + n / micro`` micro-batches
      the update has (``j`` whole ones before it, read from the counter);
    - after the epoch's last micro-step (``flush``), micro-batches still waiting (a last batch
      of whole micro-batches, fewer than ``k``) are applied the same way, by an update of their
      own.

    So the update is the mean gradient over the samples of the batch (each micro-loss weighted by
    its share of the batch), ``optimizer.iterations`` counts the user's batches, and the learning
    rate is the one of that update: what plain Keras does at the full batch. Nothing is added to
    the optimizer's variables: what an update waits for is read from its counter, which a
    checkpoint keeps with the accumulators."""

    def __init__(self, keras, tf, model):
        self.keras = keras
        self.tf = tf
        self.model = model
        self.micro = None  # the micro-batch trained (None: no accumulation)
        self.samples = None  # while a train step is traced: its batch's number of samples
        self._flush = None  # the compiled flush, for this micro-batch and accumulation
        self._train_step = None  # the model's own train_step, while ours stands in

    # -- set up ----------------------------------------------------------------------------

    def arm(self, micro, k):
        """Train micro-batches of ``micro``, ``k`` to an update (``k`` = 1: plain Keras)."""
        optimizer = self.model.optimizer
        self.micro = int(micro) if int(k) > 1 else None
        self._flush = None
        optimizer._headroom_exact = self
        if getattr(optimizer, "_headroom_exact_apply", None) is None:
            original = optimizer.apply

            def apply(grads, trainable_variables=None):
                exact = getattr(optimizer, "_headroom_exact", None)
                samples = getattr(exact, "samples", None)
                if exact is None or samples is None or not exact.micro:
                    return original(grads, trainable_variables)
                grads = exact._weighted(optimizer, list(grads), trainable_variables)
                # Keras counts the step even when the input ran out before it (its counter's
                # increment waits for nothing): here it counts micro-steps that trained.
                with exact.tf.control_dependencies([samples]):
                    return original(grads, trainable_variables)

            optimizer.apply = apply
            optimizer._headroom_exact_apply = original
        if self._train_step is None:
            model = self.model
            own = model.train_step
            exact = self

            def train_step(data):
                exact.samples = _samples(exact.keras, exact.tf, data) if exact.micro else None
                try:
                    return own(data)
                finally:
                    exact.samples = None

            self._train_step = (own, "train_step" in vars(model))
            model.train_step = train_step

    def disarm(self):
        """The model as it was (its own train_step); the optimizer weights nothing any more, and
        the train function traced with the weighting is made again when next needed."""
        if self._train_step is not None:
            own, instance = self._train_step
            if instance:
                self.model.train_step = own
            else:
                vars(self.model).pop("train_step", None)
            self._train_step = None
            self.model.train_function = None
        optimizer = getattr(self.model, "optimizer", None)
        if getattr(optimizer, "_headroom_exact", None) is self:
            optimizer._headroom_exact = None
        self.micro = None

    # -- inside the train step ---------------------------------------------------------------

    def _weighted(self, optimizer, grads, variables):
        """The micro-step's gradients weighted by its share of a whole micro-batch; a short
        micro-batch (the epoch's last) ends its update (see the class). Nothing of the
        optimizer's state changes here but its counter (which an out-of-memory error's restart
        sets again): Keras's update sees the gradients that give the mean it needs."""
        k = accumulation(optimizer)
        if self.samples is None or not self.micro or k <= 1:
            return grads
        tf = self.tf
        variables = list(variables if variables is not None else optimizer._trainable_variables)
        if not optimizer.built:  # as Keras's apply builds it, before its first update
            with self.keras.name_scope(optimizer.name, caller=optimizer):
                optimizer.build(variables)
            optimizer.built = True
        with tf.name_scope(EXACT_SCOPE):
            share = tf.cast(self.samples, tf.float32) / float(self.micro)
            short = share < 1.0
            counter = optimizer._iterations
            waiting = tf.cast(counter % k, tf.float32)  # whole micro-batches before this one
            rescale = float(k) / (waiting + share)
            accumulators = optimizer._accumulated_gradients
            kept = [i for i, g in enumerate(grads) if g is not None]
            dense = [tf.convert_to_tensor(grads[i]) for i in kept]
            sums = [accumulators[optimizer._get_variable_index(variables[i])] for i in kept]

            def whole():
                return [g * tf.cast(share, g.dtype) for g in dense]

            def closing():
                # Keras updates with (g + accumulated) / k: this g makes it the mean over the
                # micro-batches the update has, each weighted by its share.
                return [
                    g * tf.cast(share * rescale, g.dtype) + acc * tf.cast(rescale - 1.0, g.dtype)
                    for g, acc in zip(dense, sums)
                ]

            weighted = tf.cond(short, closing, whole)

            def to_last():
                self._to_last_micro_step(optimizer, k)
                return tf.constant(True)

            tf.cond(short, to_last, lambda: tf.constant(False))
        out = list(grads)
        for i, g in zip(kept, weighted):
            out[i] = g
        return out

    @staticmethod
    def _to_last_micro_step(optimizer, k):
        counter = optimizer._iterations
        counter.assign(counter - counter % k + (k - 1))

    # -- after the epoch's last micro-step --------------------------------------------------------

    def flush(self):
        """Apply the micro-batches still waiting for their update at the epoch's end (a last
        batch of whole micro-batches, fewer than the accumulation): their mean gradient, as
        plain Keras applies its last batch. Returns True when an update was made."""
        optimizer = getattr(self.model, "optimizer", None)
        k = accumulation(optimizer)
        if not self.micro or k <= 1 or not getattr(optimizer, "built", False):
            return False
        waiting = int(optimizer._iterations.numpy()) % k
        if not waiting:
            return False
        if self._flush is None:
            self._flush = self.tf.function(self._flush_step, autograph=False)
        self._flush(self.tf.constant(waiting, dtype=self.tf.float32))
        return True

    def count_the_end(self):
        """The step that finds the input's end counts as an update, as it does for plain Keras
        (the counter's increment runs while the input fails: an epoch of a dataset whose length
        is not known counts one update more than its batches, and Adam's bias correction and a
        schedule see it): here it counts a whole update, so they see the same."""
        optimizer = getattr(self.model, "optimizer", None)
        k = accumulation(optimizer)
        if self.micro and k > 1 and getattr(optimizer, "built", False):
            optimizer._iterations.assign_add(k)

    def _flush_step(self, waiting):
        tf = self.tf
        optimizer = self.model.optimizer
        k = accumulation(optimizer)
        with tf.name_scope(EXACT_SCOPE):
            variables = list(optimizer._trainable_variables)
            sums = [
                optimizer._accumulated_gradients[optimizer._get_variable_index(v)]
                for v in variables
            ]
            # (g + accumulated) / k with this g: the mean over the waiting micro-batches.
            grads = [acc * tf.cast(float(k) / waiting - 1.0, acc.dtype) for acc in sums]
            self._to_last_micro_step(optimizer, k)
        optimizer.apply(grads, variables)

    def wrap_train_function(self, last_step):
        """The model's compiled train function, which flushes (``flush``) after the epoch's
        last micro-step: once ``last_step()`` says the step was the epoch's last, or when the
        input ran out (a dataset whose length is not known). Set once Keras made it."""
        model = self.model
        inner = getattr(model, "train_function", None)
        if inner is None or getattr(inner, "_headroom_flushes", False) or not self.micro:
            return
        exact = self
        ended = (StopIteration, self.tf.errors.OutOfRangeError)

        def train_function(iterator):
            try:
                logs = inner(iterator)
            except ended:
                exact.flush()
                exact.count_the_end()
                raise
            if last_step():
                exact.flush()
            return logs

        train_function._headroom_flushes = True
        model.train_function = train_function
