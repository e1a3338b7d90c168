"""Apply the job's memory options with TensorFlow's and Keras's own calls.

The options arrive as JSON in ``HEADROOM_JOB_OPTIONS`` (written by ``trayapp.jobs.plan``):

    memory_growth     true | false | null   tf.config.experimental.set_memory_growth per GPU
    vram_limit_mb     int | [int, ...] | null   set_logical_device_configuration(memory_limit=MB);
                      a list gives one limit per visible GPU, in TensorFlow's order
    vram_option       "--vram-limit" | "--vram-reserve"   which flag the limit came from
    precision         "float32" | "mixed_float16" | "mixed_bfloat16" | null
    xla               true | false | null   tf.config.optimizer.set_jit("autoclustering" / False)
    intra_threads, inter_threads   int | null   tf.config.threading.set_*_parallelism_threads
    checkpoint_dir    str | null;  checkpoint_every_steps  int | null (null: every epoch)
    resume            bool
    on_oom            "shrink" | "smaller-batch" | "stop"   an out-of-memory error in fit():
                      train micro-batches with gradient accumulation (the same training); the
                      same, or where there is no accumulation (Keras 2) a smaller batch, which
                      changes the training; or fail as without Headroom
    min_batch         int   the smallest micro-batch shrinking goes down to
    accumulation      int   train micro-batches of batch / N from the start, N to an update (a
                      job relaunched smaller by the guard; a checkpoint's own, when larger, wins)
    fit_batch         bool  before training, choose the largest micro-batch forecast to fit (the
                      same training; ``trayapp.runner.fitbatch``); on by default
    no_fit_note_seconds   number (how long after TensorFlow/Keras import to say "no fit()")
    relaunch          {fit, accumulation, temporary} | null   set by the runner itself when it
                      relaunches the job in a fresh process (``trayapp.runner.relaunch``): fit
                      number ``fit`` resumes at micro-batches of batch / ``accumulation``;
                      ``temporary``: the checkpoint folder is the runner's own, deleted at the
                      end

Environment-only options (GPU choice, allocator, growth's environment variable) are set by the
launcher in the job's environment and need nothing here.
"""

import importlib.util
import json

_KEYS = {
    "memory_growth": (bool, type(None)),
    "vram_limit_mb": (int, list, type(None)),
    "vram_option": (str, type(None)),
    "precision": (str, type(None)),
    "xla": (bool, type(None)),
    "intra_threads": (int, type(None)),
    "inter_threads": (int, type(None)),
    "checkpoint_dir": (str, type(None)),
    "checkpoint_every_steps": (int, type(None)),
    "resume": (bool,),
    "on_oom": (str,),
    "min_batch": (int,),
    "accumulation": (int,),
    "fit_batch": (bool,),
    "no_fit_note_seconds": (int, float),
    "relaunch": (dict, type(None)),
}
# on_oom: what an out-of-memory error in fit() does. Defined here once; the job spec
# (trayapp.jobs.spec_values) checks against the same words.
ON_OOM_SHRINK = "shrink"  # micro-batches of half the batch, the same training (Keras 3)
ON_OOM_SMALLER_BATCH = "smaller-batch"  # ... and with Keras 2, half the batch (changes training)
ON_OOM_STOP = "stop"  # the error ends the job
ON_OOM = (ON_OOM_SHRINK, ON_OOM_SMALLER_BATCH, ON_OOM_STOP)
ON_OOM_SHRINKS = (ON_OOM_SHRINK, ON_OOM_SMALLER_BATCH)  # the choices that shrink
MIN_BATCH = 8  # the smallest micro-batch a shrink goes down to, unless told

DEFAULTS = {
    "memory_growth": None,
    "vram_limit_mb": None,
    "vram_option": None,
    "precision": None,
    "xla": None,
    "intra_threads": None,
    "inter_threads": None,
    "checkpoint_dir": None,
    "checkpoint_every_steps": None,
    "resume": False,
    "on_oom": ON_OOM_SHRINK,
    "min_batch": MIN_BATCH,
    "accumulation": 1,
    "fit_batch": True,  # the probe decides the first step's micro-batch unless turned off
    "no_fit_note_seconds": 60,
    "relaunch": None,
}

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


class OptionError(Exception):
    """An option that cannot be read or applied; the message is one line for the user."""


def read_options(text):
    """The options dict from the JSON text (defaults filled in); raises OptionError."""
    if not text:
        return dict(DEFAULTS)
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise OptionError(f"the job options are not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise OptionError("the job options are not a JSON object")
    options = dict(DEFAULTS)
    for key, value in raw.items():
        if key not in _KEYS:
            continue  # a newer launcher may send more; ignore what this runner does not know
        kinds = _KEYS[key]
        if isinstance(value, bool) and bool not in kinds:
            raise OptionError(f"job option {key}: {value!r} is not valid")
        if not isinstance(value, kinds):
            raise OptionError(f"job option {key}: {value!r} is not valid")
        options[key] = value
    limits = options["vram_limit_mb"]
    if isinstance(limits, list) and not all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in limits
    ):
        raise OptionError(f"job option vram_limit_mb: {limits!r} is not a list of sizes")
    if options["on_oom"] not in ON_OOM:
        raise OptionError("job option on_oom: {!r} is not valid".format(options["on_oom"]))
    if not 1 <= options["accumulation"] <= 1024:
        raise OptionError(
            "job option accumulation: {!r} is not valid".format(options["accumulation"])
        )
    if options["min_batch"] < 1:
        raise OptionError("job option min_batch: {!r} is not valid".format(options["min_batch"]))
    if options["precision"] is not None and options["precision"] not in PRECISIONS:
        raise OptionError("job option precision: {!r} is not valid".format(options["precision"]))
    if options["relaunch"] is not None:
        options["relaunch"] = _relaunch(options["relaunch"])
    return options


def _relaunch(value):
    def whole(key, low, high):
        v = value.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            raise OptionError(f"job option relaunch: {key} {v!r} is not valid")
        return v

    temporary = value.get("temporary", False)
    if not isinstance(temporary, bool):
        raise OptionError(f"job option relaunch: temporary {temporary!r} is not valid")
    return {
        "fit": whole("fit", 1, 1 << 30),
        "accumulation": whole("accumulation", 2, 1024),
        "temporary": temporary,
    }


def tensorflow_flags(options):
    """The command-line flags, in the user's words, whose options need TensorFlow calls."""
    flags = []
    if options["memory_growth"] is not None:
        flags.append("--memory-growth" if options["memory_growth"] else "--no-memory-growth")
    if options["vram_limit_mb"] is not None:
        flags.append(options["vram_option"] or "--vram-limit")
    if options["xla"] is not None:
        flags.append("--xla" if options["xla"] else "--no-xla")
    if options["intra_threads"] is not None or options["inter_threads"] is not None:
        flags.append("--threads")
    return flags


def missing_requirement(options):
    """A one-line message when an option needs TensorFlow or Keras and neither is installed."""
    flags = tensorflow_flags(options)
    if flags and importlib.util.find_spec("tensorflow") is None:
        return "{} needs TensorFlow, which is not installed for this Python".format(
            ", ".join(flags)
        )
    if options["precision"] is not None and not any(
        importlib.util.find_spec(name) is not None for name in ("keras", "tf_keras", "tensorflow")
    ):
        return "--precision needs Keras, which is not installed for this Python"
    return None


def _first_line(error):
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def apply_tensorflow(tf, options):
    """Apply the TensorFlow options; returns what was applied, as dicts for ``hello``.

    Must run before TensorFlow initialises its devices (the runner calls it the moment
    ``tensorflow`` finishes importing). Raises OptionError when TensorFlow refuses an option.
    """
    applied = []
    gpus = None

    def physical_gpus():
        nonlocal gpus
        if gpus is None:
            gpus = tf.config.list_physical_devices("GPU")
        return gpus

    growth = options["memory_growth"]
    if growth is not None:
        flag = "--memory-growth" if growth else "--no-memory-growth"
        try:
            for gpu in physical_gpus():
                tf.config.experimental.set_memory_growth(gpu, growth)
        except (RuntimeError, ValueError) as e:
            raise OptionError(f"{flag}: TensorFlow refused it: {_first_line(e)}") from None
        applied.append(
            {
                "option": "memory_growth",
                "value": growth,
                "call": "tf.config.experimental.set_memory_growth",
                "devices": [g.name for g in physical_gpus()],
            }
        )

    limits = options["vram_limit_mb"]
    if limits is not None:
        flag = options["vram_option"] or "--vram-limit"
        devices = []
        try:
            for i, gpu in enumerate(physical_gpus()):
                if isinstance(limits, list):
                    if i >= len(limits):
                        continue
                    mb = limits[i]
                else:
                    mb = limits
                tf.config.set_logical_device_configuration(
                    gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=mb)]
                )
                devices.append({"name": gpu.name, "memory_limit_mb": mb})
        except (RuntimeError, ValueError) as e:
            raise OptionError(f"{flag}: TensorFlow refused it: {_first_line(e)}") from None
        applied.append(
            {
                "option": "vram_limit_mb",
                "value": limits,
                "call": "tf.config.set_logical_device_configuration",
                "devices": devices,
            }
        )

    xla = options["xla"]
    if xla is not None:
        tf.config.optimizer.set_jit("autoclustering" if xla else False)
        applied.append({"option": "xla", "value": xla, "call": "tf.config.optimizer.set_jit"})

    for key, setter in (
        ("intra_threads", "set_intra_op_parallelism_threads"),
        ("inter_threads", "set_inter_op_parallelism_threads"),
    ):
        n = options[key]
        if n is None:
            continue
        try:
            getattr(tf.config.threading, setter)(n)
        except (RuntimeError, ValueError) as e:
            raise OptionError(f"--threads: TensorFlow refused it: {_first_line(e)}") from None
        applied.append({"option": key, "value": n, "call": "tf.config.threading." + setter})
    return applied


def apply_precision(keras, name):
    """Set Keras's global dtype policy; returns what was applied. Raises OptionError."""
    config = getattr(keras, "config", None)
    try:
        if config is not None and hasattr(config, "set_dtype_policy"):
            config.set_dtype_policy(name)
            call = "keras.config.set_dtype_policy"
        else:
            keras.mixed_precision.set_global_policy(name)
            call = "keras.mixed_precision.set_global_policy"
    except (RuntimeError, ValueError, AttributeError) as e:
        raise OptionError(f"--precision: Keras refused it: {_first_line(e)}") from None
    return {"option": "precision", "value": name, "call": call, "module": keras.__name__}


def build_info(tf):
    """CUDA/cuDNN of the TensorFlow build (static; starts nothing), or None."""
    try:
        info = dict(tf.sysconfig.get_build_info())
    except Exception:
        return None
    return {
        "is_cuda_build": bool(info.get("is_cuda_build", False)),
        "cuda_version": info.get("cuda_version"),
        "cudnn_version": info.get("cudnn_version"),
    }


def devices(tf):
    """The physical devices TensorFlow sees, as [{name, type}], or None if it cannot tell."""
    try:
        return [{"name": d.name, "type": d.device_type} for d in tf.config.list_physical_devices()]
    except Exception:
        return None


def gpu_memory(tf, names):
    """[{device, current_bytes, peak_bytes}] for the given logical GPU names (None if unknown)."""
    out = []
    for name in names:
        try:
            info = tf.config.experimental.get_memory_info(name)
        except Exception:
            return None
        out.append(
            {"device": name, "current_bytes": info.get("current"), "peak_bytes": info.get("peak")}
        )
    return out
