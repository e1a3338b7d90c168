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


def _sizes(batch, floor):
    """The micro-batch probed: a sixteenth of the batch (not below the floor). Small, because
    on the host TensorFlow's oneDNN kernels keep the buffers of every step size they ran for the
    rest of the process: a probe at a quarter of the batch forecast within 4% but left the job
    some 250 MB above what training alone needs (over its budget, in the test of this); at a
    sixteenth the forecast is 8-26% high (bench_forecast), which errs toward a smaller
    micro-batch. One size: a second, smaller one would add its own kept buffers to the peak of
    the first as memory per sample."""
    smaller = [m for m, _ in forecast.candidates(batch, floor)[1:]]
    if not smaller:
        return []
    target = max(floor, batch // forecast.PROBE_FRACTION)
    return [min((m for m in smaller if m >= target), default=smaller[-1])]


class _Saved:
    """The model's and the optimizer's variables as they are now, to put back after probing."""

    def __init__(self, model):
        optimizer = model.optimizer
        if not getattr(optimizer, "built", False):
            optimizer.build(model.trainable_variables)
        self.model = model
        self.values = [(v, v.numpy()) for v in
                       list(model.trainable_variables) + list(model.non_trainable_variables)
                       + list(optimizer.variables)]

    def restore(self):
        for variable, value in self.values:
            variable.assign(value)
        try:
            self.model.reset_metrics()
        except Exception:  # a model without metrics to reset
            pass


def probe(run, shrinker, meter):
    """Train the probe's micro-batch, measured; returns {device: [(micro, peak)]} with each
    device's base as ``device#held`` (possibly empty), the model as it was before."""
    model = run.model
    sizes = _sizes(shrinker.effective_batch(), shrinker.floor)
    points = {}
    if not sizes:
        return points
    saved = _Saved(model)
    before = meter.read()
    if forecast.RAM in before:
        # The host before any probe step: TensorFlow, the data, the weights.
        points[forecast.RAM + "#held"] = [(0, before[forecast.RAM][0])]
    try:
        for micro in sizes:
            x, y, weights = _slice(shrinker, micro)
            model.train_on_batch(x, y, sample_weight=weights)  # traced at this size
            meter.reset()
            after_first = meter.read()
            model.train_on_batch(x, y, sample_weight=weights)
            for name, (_now, peak) in meter.read().items():
                points.setdefault(name, []).append((micro, peak))
                if name != forecast.RAM and name in after_first:
                    # A GPU's allocator after a step: its weights and optimizer state.
                    points[name + "#held"] = [(0, after_first[name][0])]
    except Exception as error:
        if not shrink.is_oom(error):
            raise
        run.session.note("warn", f"--fit-batch: out of memory at a probe micro-batch "
                                 f"({shrink.oom_text(error)})")
    finally:
        saved.restore()
        model.train_function = None  # traced for the probes' sizes and state
    return points


def _devices(points):
    """The forecast of each device: the line from what it held before the probe's steps (the
    host: before any; a GPU: after a step, its weights and optimizer state) to its peak."""
    out = []
    for name, measured in points.items():
        if name.endswith("#held") or not measured:
            continue
        base = points.get(name + "#held", [])
        fit = forecast.line(base + measured[-1:]) if base else forecast.line(measured)
        if fit is None:
            continue
        fixed, per_sample = fit
        micro, peak = measured[-1]
        out.append(forecast.device(name, fixed, per_sample, peak, micro))
    return out


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
        session.note("warn", f"--fit-batch: {shrinker.refusal()}: trained at the full batch")
        return False
    if not getattr(run.model, "built", False):
        session.note("warn", "--fit-batch: the model is not built before fit() (give it an Input "
                             "layer): trained at the full batch")
        return False
    batch = shrinker.effective_batch()
    if _too_large_to_set_aside(run):
        return False
    tf = sys.modules.get("tensorflow")
    gpu_names = _gpu_names(tf)
    try:
        points = probe(run, shrinker, forecast.Meter(tf, gpu_names))
    except Exception as error:
        session.note("warn", f"--fit-batch: the probe failed ({_first_line(error)}): trained "
                             "at the full batch")
        return False
    devices = _devices(points)
    if not devices:
        session.note("warn", "--fit-batch: no memory could be measured: trained at the full "
                             "batch")
        return False
    accumulators = forecast.accumulator_bytes(run.model, gpu_names)
    k = session.ask_fit(protocol.make(
        protocol.FORECAST, fit=run.index, how=forecast.PROBE, batch=batch,
        micro_batch=shrink.micro_batch(batch, shrinker.k), accumulation=shrinker.k,
        devices=devices, accumulators=[{"device": d, "bytes": b}
                                       for d, b in accumulators.items()]), ANSWER_SECONDS)
    how = ""
    allowed = {acc for _, acc in forecast.candidates(batch, shrinker.floor)}
    if k is not None and k and k not in allowed:
        session.note("warn", f"--fit-batch: the engine's answer ({k} micro-batches an update) "
                             f"does not split batch {batch}: trained at the full batch")
        return False
    if k is None:
        chosen = forecast.choose(devices, batch, shrinker.floor, _local_room(), accumulators,
                                 shrinker.k)
        k = chosen[1] if chosen else None
        how = " (by the host's available memory: no engine answered)"
    return _train_at(run, shrinker, batch, k, how)


def _too_large_to_set_aside(run):
    """The probe keeps a copy of the model's and the optimizer's state on the host while it
    trains: not when that copy would take more than a quarter of the host's available
    memory (it would be the one to run the machine short)."""
    model = run.model
    optimizer = model.optimizer
    size = forecast.variables_bytes(list(model.variables) + list(
        getattr(optimizer, "variables", None) or ()))
    if not getattr(optimizer, "built", False):
        size += 2 * forecast.variables_bytes(model.trainable_variables)  # slots to come
    room = _local_room().get(forecast.RAM)
    if room is None or size <= room // 4:
        return False
    run.session.note("warn", f"--fit-batch: the model's state ({size >> 20} MiB) is too large "
                             f"to set aside for the probe ({room >> 20} MiB available): "
                             "trained at the full batch")
    return True


def _train_at(run, shrinker, batch, k, how):
    session = run.session
    if not k:
        session.note("warn", f"--fit-batch: batch {batch} is forecast not to fit even at "
                             f"micro-batches of {shrinker.floor}{how}: trained as asked, "
                             "shrinking on an out-of-memory error")
        return False
    if k <= shrinker.k:
        session.note("info", f"--fit-batch: batch {batch} is forecast to fit{how}")
        return False
    micro = shrinker.apply(k)
    run.accumulation = k
    run.batch = (batch, micro)
    session.note("warn", f"--fit-batch: training micro-batches of {micro} x {k} (batch {batch}, "
                         f"the same training): the full batch is forecast not to fit{how}",
                 topic=protocol.TOPIC_SHRUNK)
    return True


def _gpu_names(tf):
    if tf is None:
        return []
    try:
        return [d.name for d in tf.config.list_logical_devices("GPU")]
    except Exception:  # TensorFlow without its config module, or one that fails to say
        return []
