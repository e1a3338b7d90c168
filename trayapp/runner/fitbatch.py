"""``--fit-batch``: choose the largest micro-batch that fits before training starts, keeping the
effective batch (the same training), from a forecast made on a smaller micro-batch.

The probe trains two steps at a sixteenth of the batch (``forecast.PROBE_FRACTION``; the first
traces the step), measures the second one's peak, and puts the model's weights and the
optimizer's state back as they were, so the training that follows is the one asked for. The
engine, which knows what is free on the machine and the job's budgets, answers with the
accumulation to train at; with no engine, the runner looks at the host's available memory itself
(and cannot see a GPU's).
"""

import sys

from . import forecast, protocol, shrink
from .training import _first_line

ANSWER_SECONDS = 5.0  # how long the runner waits for the engine's choice
TRACE_SIZES = (1, 2)  # the probe's first steps, which trace its train step


def _slice(shrinker, micro):
    """(x, y, sample_weight) of one micro-batch of the fit's input."""
    args = shrinker.bound.arguments
    if shrinker.kind == shrink.ARRAYS:
        tree = shrinker.keras.tree

        def cut(value):
            return None if value is None else tree.map_structure(lambda a: a[:micro], value)

        return cut(args.get("x")), cut(args.get("y")), cut(args.get("sample_weight"))
    element = next(iter(shrink.rebatch(shrinker.x, micro).take(1)))
    if isinstance(element, tuple):
        parts = list(element) + [None] * (3 - len(element))
        return parts[0], parts[1], parts[2]
    return element, None, None


def _size(batch, floor):
    """The micro-batch probed (None: the batch does not split): a sixteenth of the batch (not
    below the floor). Small, because on the host TensorFlow's oneDNN kernels keep the buffers
    of every step size they ran for the rest of the process: a probe at a quarter of the batch
    forecast within 4% but left the job some 250 MB above what training alone needs (over its
    budget, in the test of this); at a sixteenth the forecast is 8-26% high (bench_forecast),
    which errs toward a smaller micro-batch. One size: a second, smaller one would add its own
    kept buffers to the peak of the first as memory per sample."""
    smaller = [m for m, _ in forecast.candidates(batch, floor)[1:]]
    if not smaller:
        return None
    target = max(floor, batch // forecast.PROBE_FRACTION)
    return min((m for m in smaller if m >= target), default=smaller[-1])


class _Saved:
    """The model's and the optimizer's variables as they are now, to put back after probing."""

    def __init__(self, model):
        optimizer = model.optimizer
        if not getattr(optimizer, "built", False):
            optimizer.build(model.trainable_variables)
        self.model = model
        self.values = [
            (v, v.numpy())
            for v in list(model.trainable_variables)
            + list(model.non_trainable_variables)
            + list(optimizer.variables)
        ]

    def restore(self):
        for variable, value in self.values:
            variable.assign(value)
        try:
            self.model.reset_metrics()
        except Exception:  # a model without metrics to reset
            pass


def probe(run, shrinker, meter):
    """Two steps at the probe's micro-batch, the second measured: each device's forecast, from
    what it held before (the host: before any step, TensorFlow, the data, the weights; a GPU:
    after the first, its weights and optimizer state) to the peak. The model is put back as it
    was; an empty list when nothing was measured."""
    model = run.model
    micro = _size(shrinker.effective_batch(), shrinker.floor)
    if micro is None:
        return []
    saved = _Saved(model)
    before = meter.read()
    try:
        x, y, weights = _slice(shrinker, micro)
        traced = 0
        for tiny in TRACE_SIZES:
            # Traced at two tiny sizes, the second trace for any size (Keras's
            # reduce_retracing): what the traces keep is then part of the base, not counted
            # as memory per sample and multiplied by the batch.
            if tiny < micro:
                model.train_on_batch(*_cut(shrinker, (x, y, weights), tiny))
                traced = tiny
        traces = 0
        if traced:
            before_host = meter.read().get(forecast.RAM)
            if before_host is not None:
                traces = max(0, before_host[0] - before.get(forecast.RAM, before_host)[0])
                before = dict(before, **{forecast.RAM: before_host})
        model.train_on_batch(x, y, sample_weight=weights)  # traced at this size, if not yet
        meter.reset()
        after_first = meter.read()
        model.train_on_batch(x, y, sample_weight=weights)
        peaks = meter.read()
    except Exception as error:
        if not shrink.is_oom(error):
            raise
        run.session.note(
            protocol.NOTE_WARN,
            f"--fit-batch: out of memory at a probe micro-batch ({shrink.oom_text(error)})",
        )
        return []
    finally:
        saved.restore()
        model.train_function = None  # traced for the probe's size and state
    out = []
    for name, (_now, peak) in peaks.items():
        base = (before if name == forecast.RAM else after_first).get(name)
        if base is not None:
            # The host keeps what the probe used (oneDNN's buffers of its size) and the fit
            # traces its step again: both are part of what the fit will need.
            extra = traces + max(0, peak - base[0]) if name == forecast.RAM else 0
            out.append(forecast.from_base(name, base[0], peak, micro, traced, extra))
    return out


def _cut(shrinker, parts, size):
    """(x, y, sample_weight) cut to their first ``size`` samples."""
    tree = shrinker.keras.tree
    return tuple(None if p is None else tree.map_structure(lambda a: a[:size], p) for p in parts)


def _local_room():
    """{device: bytes} this process may grow to, as the host says (no GPU: it cannot see)."""
    try:
        with open("/proc/meminfo") as f:
            for text in f:
                if text.startswith("MemAvailable:"):
                    available = int(text.split()[1]) * 1024
                    found = forecast.host_read()
                    return {forecast.RAM: available + (found[0] if found else 0)}
    except (OSError, ValueError, IndexError):
        pass
    return {}


def fit_batch(run, shrinker):
    """Before the fit: probe, forecast, and train at the largest micro-batch that fits (the
    engine's choice, or the host's when no engine answers). Returns True when it changed."""
    session = run.session
    if shrinker.refusal() is not None:
        session.note(
            protocol.NOTE_WARN, f"--fit-batch: {shrinker.refusal()}: trained at the full batch"
        )
        return False
    if not getattr(run.model, "built", False):
        session.note(
            protocol.NOTE_WARN,
            "--fit-batch: the model is not built before fit() (give it an Input "
            "layer): trained at the full batch",
        )
        return False
    batch = shrinker.effective_batch()
    if _too_large_to_set_aside(run):
        return False
    tf = sys.modules.get("tensorflow")
    gpu_names = forecast.gpu_names(tf)
    try:
        devices = probe(run, shrinker, forecast.Meter(tf, gpu_names))
    except Exception as error:
        session.note(
            protocol.NOTE_WARN,
            f"--fit-batch: the probe failed ({_first_line(error)}): trained at the full batch",
        )
        return False
    if not devices:
        session.note(
            protocol.NOTE_WARN,
            "--fit-batch: no memory could be measured: trained at the full batch",
        )
        return False
    accumulators = forecast.accumulator_bytes(run.model, gpu_names)
    k = session.ask_fit(
        protocol.make(
            protocol.FORECAST,
            fit=run.index,
            how=forecast.PROBE,
            batch=batch,
            micro_batch=shrink.micro_batch(batch, shrinker.k),
            accumulation=shrinker.k,
            devices=devices,
            accumulators=[{"device": d, "bytes": b} for d, b in accumulators.items()],
        ),
        ANSWER_SECONDS,
    )
    how = ""
    allowed = {acc for _, acc in forecast.candidates(batch, shrinker.floor)}
    if k is not None and k and k not in allowed:
        session.note(
            protocol.NOTE_WARN,
            f"--fit-batch: the engine's answer ({k} micro-batches an update) "
            f"does not split batch {batch}: trained at the full batch",
        )
        return False
    if k is None:
        chosen = forecast.choose(
            devices, batch, shrinker.floor, _local_room(), accumulators, shrinker.k
        )
        k = chosen[1] if chosen else None
        how = " (by the host's available memory: no engine answered)"
    return _train_at(run, shrinker, batch, k, how)


def _too_large_to_set_aside(run):
    """The probe keeps a copy of the model's and the optimizer's state on the host while it
    trains: not when that copy would take more than a quarter of the host's available
    memory (it would be the one to run the machine short)."""
    model = run.model
    optimizer = model.optimizer
    size = forecast.variables_bytes(
        list(model.variables) + list(getattr(optimizer, "variables", None) or ())
    )
    if not getattr(optimizer, "built", False):
        size += 2 * forecast.variables_bytes(model.trainable_variables)  # slots to come
    room = _local_room().get(forecast.RAM)
    if room is None or size <= room // 4:
        return False
    run.session.note(
        protocol.NOTE_WARN,
        f"--fit-batch: the model's state ({size >> 20} MiB) is too large "
        f"to set aside for the probe ({room >> 20} MiB available): "
        "trained at the full batch",
    )
    return True


def _train_at(run, shrinker, batch, k, how):
    session = run.session
    if not k:
        session.note(
            protocol.NOTE_WARN,
            f"--fit-batch: batch {batch} is forecast not to fit even at "
            f"micro-batches of {shrinker.floor}{how}: trained as asked, "
            "shrinking on an out-of-memory error",
        )
        return False
    if k <= shrinker.k:
        session.note(protocol.NOTE_INFO, f"--fit-batch: batch {batch} is forecast to fit{how}")
        return False
    micro = shrinker.apply(k)
    run.accumulation = k
    run.batch = (batch, micro)
    session.note(
        protocol.NOTE_WARN,
        f"--fit-batch: training micro-batches of {micro} x {k} (batch {batch}, "
        f"the same training): the full batch is forecast not to fit{how}",
        topic=protocol.TOPIC_SHRUNK,
    )
    return True
