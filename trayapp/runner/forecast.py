"""The forecast: how much memory a fit needs at a batch size, from what its first steps used.

Memory of a training step is modelled as ``fixed + per_sample x micro-batch`` on each device:
"ram" (the process's resident memory) and each GPU TensorFlow sees ("GPU:0", ...). The runner
measures it two ways:

- During the first steps of every fit (``StepMeter``): the baseline as training begins (for the
  host, the resident memory: TensorFlow, the data, the weights; for a GPU, the bytes TensorFlow's
  allocator holds after the first step, its weights and optimizer state), then the peak over
  the (up to 5) steps after the first (which traces the step and is not typical), at the
  micro-batch it trains. One batch size: the per-sample part is the peak over the baseline, per
  sample. The host's baseline leaves out what the first step's tracing keeps, so this
  over-estimates the per-sample part a little, which errs toward a smaller micro-batch; its
  fixed part adds ``STEPS_ALLOWANCE`` of what the steps added, for what they do not show (a
  validation step, the trace of a short last batch).
- Before training, on request (``--fit-batch``, ``trayapp.runner.fitbatch``): two steps at a
  sixteenth of the batch, the line from what each device held before them to their peak, and the
  model's weights and optimizer state put back as they were. Before them, steps at one and two
  samples trace the step (the second trace serves any size), so what the traces keep is part of
  the host's base and not taken for memory per sample; the host's fixed part then adds what the
  probe leaves behind and the traces again (the fit traces its own step). The full batch never
  runs to find the answer, so the forecast does not risk the machine's memory on it.

Peaks come from TensorFlow's allocator for GPUs (``get_memory_info(...)["peak"]``, after
``reset_memory_stats``) and from the kernel for the host (``VmHWM``, reset by writing 5 to
``/proc/self/clear_refs``; Linux only: elsewhere the host has no forecast).

The engine compares the forecast with what is free and with the job's budgets
(``trayapp.jobs.forecasts``); ``choose`` is shared by both sides.

Stdlib only: this runs inside the user's interpreter.
"""

import sys

RAM = "ram"
# Steps measured after the first one: their peak is the step's. Over 2, a small CNN's peak was
# 30 MB short of the fit's in one run of four (when its allocations did not overlap), over 5 in
# none of six; an epoch of fewer steps is measured over all but its first (2 at least).
MEASURED_STEPS = 5
FEWEST_MEASURED = 2
PROBE = "probe"
STEPS = "steps"
# A forecast is a line through measured points: the micro-batch chosen keeps this share of the
# room free for the forecast's own error.
MARGIN = 0.9
PROBE_FRACTION = 16  # --fit-batch's probe trains batch / 16 (or the floor, when larger)
# The host's peak over a whole fit against the one of its first steps (bench_forecast): what
# they add, and this share of it again, which the forecast adds to its fixed part.
STEPS_ALLOWANCE = 0.1


# -- reading memory ---------------------------------------------------------------------------


def _status_bytes(keys):
    try:
        with open("/proc/self/status") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = {}
    for line in lines:
        name, _, rest = line.partition(":")
        if name in keys:
            parts = rest.split()
            if parts and parts[0].isdigit():
                found[name] = int(parts[0]) * 1024
    return tuple(found.get(k) for k in keys) if len(found) == len(keys) else None


def host_reset():
    """Set the process's resident high-water mark to its resident memory now (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def host_read():
    """(resident bytes now, resident bytes at the peak since the last reset) or None."""
    return _status_bytes(("VmRSS", "VmHWM"))


def _gpu_call(tf, name, what):
    experimental = tf.config.experimental
    try:
        if what == "reset":
            experimental.reset_memory_stats(name)
            return True
        info = experimental.get_memory_info(name)
        return int(info["current"]), int(info["peak"])
    except Exception:  # a device TensorFlow does not count (or a build without the call)
        return None


class Meter:
    """Peak memory of this process since ``reset``, on the host and on each GPU."""

    def __init__(self, tf, gpu_names):
        self.tf = tf
        self.gpus = [n.split("device:")[-1] for n in gpu_names] if tf is not None else []
        self.host = sys.platform.startswith("linux")

    def reset(self):
        if self.host:
            self.host = host_reset() and host_read() is not None
        for name in self.gpus:
            _gpu_call(self.tf, name, "reset")

    def read(self):
        """{device: (bytes now, peak bytes since the reset)}."""
        out = {}
        if self.host:
            found = host_read()
            if found is not None:
                out[RAM] = found
        for name in self.gpus:
            found = _gpu_call(self.tf, name, "read")
            if found is not None:
                out[name] = found
        return out


# -- the line -----------------------------------------------------------------------------------


def line(points):
    """(fixed, per_sample) of the line through ``points`` [(micro-batch, bytes)], least squares;
    the per-sample part is never below 0. None without two different batch sizes."""
    sizes = {b for b, _ in points}
    if len(sizes) < 2:
        return None
    n = len(points)
    mean_b = sum(b for b, _ in points) / n
    mean_m = sum(m for _, m in points) / n
    var = sum((b - mean_b) ** 2 for b, _ in points)
    slope = max(0.0, sum((b - mean_b) * (m - mean_m) for b, m in points) / var)
    return max(0, int(mean_m - slope * mean_b)), slope


def device(name, fixed, per_sample, peak, measured_batch):
    """One device's forecast as the runner sends it."""
    return {
        "device": name,
        "fixed_bytes": int(fixed),
        "per_sample_bytes": int(per_sample),
        "peak_bytes": int(peak),
        "measured_batch": int(measured_batch),
    }


def need(entry, micro, k, accumulators=0):
    """Bytes a device needs at micro-batches of ``micro`` accumulated ``k`` times (the
    accumulators, one copy of the trainable weights, only when ``k`` > 1)."""
    extra = accumulators if k > 1 else 0
    return int(entry["fixed_bytes"] + entry["per_sample_bytes"] * micro + extra)


def from_base(name, base, peak, micro, at=0, extra=0):
    """One device's forecast from what it held before the measured steps (``base``, after
    steps at micro-batches of ``at``, 0: none) and their peak at micro-batches of ``micro``;
    ``extra``: bytes the fit will hold besides (added to the fixed part)."""
    base = min(base, peak)
    per_sample = (peak - base) / max(1, micro - at)
    return device(name, max(0, base - per_sample * at) + max(0, extra), per_sample, peak, micro)


def gpu_names(tf):
    """The GPUs TensorFlow sees ("/device:GPU:0", ...); none without TensorFlow."""
    if tf is None:
        return []
    try:
        return [d.name for d in tf.config.list_logical_devices("GPU")]
    except Exception:  # TensorFlow without its config module, or one that fails to say
        return []


def candidates(batch, floor, k=1):
    """[(micro-batch, accumulation)] from ``batch / k`` down, halving, while the batch splits
    evenly and the micro-batch stays at or above ``floor``."""
    out = []
    while batch % k == 0 and batch // k >= max(1, floor) and k <= 1024:
        out.append((batch // k, k))
        k *= 2
    return out


def choose(devices, batch, floor, room, accumulators=None, k=1, margin=MARGIN):
    """The largest micro-batch (micro, accumulation) whose need fits ``room`` {device: bytes}
    on every device with a known room (each kept ``margin`` full), or None when none does.
    ``accumulators``: {device: bytes of one copy of the trainable weights}."""
    accumulators = accumulators or {}
    for micro, acc in candidates(batch, floor, k):
        fits = True
        for entry in devices:
            space = room.get(entry["device"])
            if space is None:
                continue
            if need(entry, micro, acc, accumulators.get(entry["device"], 0)) > space * margin:
                fits = False
                break
        if fits:
            return micro, acc
    return None


# -- during the first steps -------------------------------------------------------------------


class StepMeter:
    """The forecast from the first steps of a fit: ``begin`` as training begins, ``step`` at
    every batch begin with the steps trained so far; returns the devices' forecast once."""

    def __init__(self, meter, micro, steps=None):
        self.meter = meter
        self.micro = int(micro)
        self.base = meter.read() if meter is not None else {}
        self.start = None  # steps trained when the peaks were reset
        # ``steps``: the micro-steps of an epoch, when known
        self.measured = (
            MEASURED_STEPS
            if not steps
            else max(FEWEST_MEASURED, min(MEASURED_STEPS, int(steps) - 1))
        )

    def step(self, trained):
        """None until the measured steps are done; then the list of devices (once)."""
        if self.start is None:
            if trained >= 1:
                self.meter.reset()
                self.start = trained
                self.after_first = self.meter.read()
            return None
        if trained < self.start + self.measured:
            return None
        now = self.meter.read()
        out = []
        for name, (_current, peak) in now.items():
            # Host: the baseline as training began; a GPU: what its allocator held after the
            # first step (weights, optimizer state), the activations given back.
            base = (self.base if name == RAM else self.after_first).get(name)
            if base is not None:
                # The host: what the first steps did not show (the validation's step, the last
                # short batch's trace, later epochs) as a share of what the steps added.
                extra = STEPS_ALLOWANCE * max(0, peak - base[0]) if name == RAM else 0
                out.append(from_base(name, base[0], peak, self.micro, extra=extra))
        return out


def accumulator_bytes(model, gpu_names):
    """{device: bytes of one copy of the trainable weights}: what accumulating adds (on the
    first GPU when there is one, else on the host)."""
    name = gpu_names[0].split("device:")[-1] if gpu_names else RAM
    return {name: variables_bytes(getattr(model, "trainable_variables", None) or ())}


def variables_bytes(variables):
    """The bytes of the values of ``variables``."""
    total = 0
    for v in variables:
        try:
            size = 1
            for dim in v.shape:
                size *= int(dim)
            total += size * int(getattr(getattr(v, "dtype", None), "size", 0) or _itemsize(v))
        except (TypeError, ValueError):
            continue
    return total


def _itemsize(variable):
    dtype = str(getattr(variable, "dtype", "float32"))
    for bits in ("64", "32", "16", "8"):
        if bits in dtype:
            return int(bits) // 8
    return 4
