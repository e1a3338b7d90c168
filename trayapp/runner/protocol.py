"""The job channel: messages between a job's runner and the engine, defined once.

Stdlib only and Python >= 3.9: this module runs inside the user's own interpreter. The engine
imports it too (``trayapp.runner.protocol``). Messages are JSON objects sent with
``multiprocessing.connection`` ``send_bytes``/``recv_bytes``, authenticated with a key that is
different for every job. Nothing is ever unpickled.

The runner is the client: it connects to the address the engine gave it, says ``hello``, and
reconnects (saying ``hello`` again) whenever the engine goes away and comes back.
"""

import json

# Environment variables the launcher sets for the runner. The runner removes the key-file
# variable before the user's script runs.
ENV_JOB_ID = "HEADROOM_JOB_ID"
ENV_ADDRESS = "HEADROOM_JOB_ADDRESS"
ENV_KEYFILE = "HEADROOM_JOB_KEYFILE"
ENV_OPTIONS = "HEADROOM_JOB_OPTIONS"  # JSON: the options the runner applies inside TensorFlow
# JSON: {nice, oom_score_adj, log, log_max_bytes}, what the runner sets before the script runs.
ENV_PROCESS = "HEADROOM_JOB_PROCESS"

# Exit status of a job that was parked: checkpointed, training stopped, process ended on purpose.
# 75 is EX_TEMPFAIL in sysexits.h: "try again later", which is what a parked job means.
PARK_EXIT_CODE = 75

# Exit status of a job that was stopped on request: its fit() ended at a batch (after a
# checkpoint, when the job has a checkpoint folder) and the rest of the script did not run.
# Next to the park status; a stopped job with a checkpoint folder is resumed like a parked one.
STOP_EXIT_CODE = 76

# Exit status when an option needs TensorFlow (or Keras) and the job's Python does not have it.
# 69 is EX_UNAVAILABLE in sysexits.h: a required service is not there.
NO_TENSORFLOW_EXIT_CODE = 69

# Exit status when the runner cannot apply an option inside TensorFlow (TensorFlow refused it), or
# its options variable is unreadable. 78 is EX_CONFIG in sysexits.h.
OPTIONS_EXIT_CODE = 78

MAX_MESSAGE_BYTES = 1 << 20

# job -> engine
HELLO = "hello"  # applied options, versions, devices, whether fit() is hooked
PROGRESS = "progress"  # epoch/epochs, step/steps, logs (loss, metrics), tf_memory; when known:
# batch (the effective batch), micro_batch, accumulation (micro-batches per update), shrinkable
# (the fit can train smaller micro-batches: Keras 3, input it can re-batch, --on-oom shrink)
STATE = "state"  # state: running | pausing | paused | checkpointing | parking | stopping
# ("stopping" only while a fit() runs: the runner ends it at the next batch and exits)
CHECKPOINTED = "checkpointed"  # path, epoch
NOTE = "note"  # level, message (e.g. "no fit() call: progress not available"), topic (optional)
TOPIC_SHRUNK = "shrunk"  # a note's topic: the fit trains smaller micro-batches from now on
BYE = "bye"  # reason: finished | parked | stopped | error, exit_code
FORECAST = "forecast"  # the memory a fit needs: fixed + per sample x micro-batch, per device

# Fields, as the runner sends them (fields may be added, never renamed):
#   hello: job_id, pid, python (executable), python_version, script, options (as received),
#          applied [{option, value, call, devices?}], tf_version, keras_version (null when not
#          installed), tf_imported, build_info {is_cuda_build, cuda_version, cudnn_version} or
#          null, tf_devices [{name, type}] or null (null until TensorFlow has been imported and
#          has started), fit_hook ("waiting": Keras not imported yet | "installed" |
#          "unavailable"). Sent on every (re)connection and again when any of it changes.
#   progress: fit (1 for the script's first fit() call), epoch (1-based), epochs, step (batches
#          done in this epoch), steps (null when unknown), logs {name: float or null},
#          tf_memory [{device, current_bytes, peak_bytes}] or null. At most 4 a second (and
#          the last one as the job ends).
#   state: state, and for paused: epoch (1-based), step (batches done in it).
#   checkpointed: path (folder), epoch (epochs done), step (batches done in the next epoch),
#          fit, reason ("request" | "park" | "stop" | "interval" | "epoch" | "end" |
#          "oom" | "relaunch").
#   note: level ("info" | "warn" | "error"), message (one line).
#   bye: reason, exit_code (a negative number is the signal that ended the script).
#   forecast: fit, how ("steps": measured in its first steps | "probe": --fit-batch, before
#          training, which waits for the engine's "fit" answer), batch (effective), micro_batch,
#          accumulation (as trained when measured), devices [{device ("ram" | "GPU:0" ...),
#          fixed_bytes, per_sample_bytes, peak_bytes, measured_batch}], accumulators
#          [{device, bytes}] (one copy of the trainable weights: what accumulating adds).

# engine -> job
PAUSE = "pause"
RESUME = "resume"
CHECKPOINT = "checkpoint"
PARK = "park"
STOP = "stop"
FIT = "fit"  # accumulation (0: the full batch does not fit at any micro-batch) -- the answer
# to a "probe" forecast: train micro-batches of batch / N

JOB_MESSAGES = frozenset({HELLO, PROGRESS, STATE, CHECKPOINTED, NOTE, BYE, FORECAST})

# The words inside the messages, defined here once: the runner sends them, the engine
# (trayapp.jobs.messages) accepts only these.

# A state message's ``state``: the runner's own states, not job states (trayapp.vocab.JobState).
STATE_RUNNING = "running"
STATE_PAUSING = "pausing"  # asked to pause: it waits at the next batch end
STATE_PAUSED = "paused"
STATE_CHECKPOINTING = "checkpointing"
STATE_PARKING = "parking"
STATE_STOPPING = "stopping"  # only while a fit() runs: it ends at the next batch
STATE_STOPPED = "stopped"  # accepted by the engine; the runner says it in its bye
STATE_IDLE = "idle"  # a kernel's runner between fit() calls: nothing to interrupt
RUNNER_STATES = frozenset(
    {
        STATE_RUNNING,
        STATE_PAUSING,
        STATE_PAUSED,
        STATE_CHECKPOINTING,
        STATE_PARKING,
        STATE_STOPPING,
        STATE_STOPPED,
        STATE_IDLE,
    }
)

# A bye's ``reason``.
BYE_FINISHED = "finished"
BYE_PARKED = "parked"
BYE_STOPPED = STATE_STOPPED
BYE_ERROR = "error"
BYE_REASONS = frozenset({BYE_FINISHED, BYE_PARKED, BYE_STOPPED, BYE_ERROR})

# A hello's ``fit_hook``.
FIT_HOOK_WAITING = "waiting"  # Keras not imported yet
FIT_HOOK_INSTALLED = "installed"  # keras.Model.fit is patched: pause, park and stop at a batch end
FIT_HOOK_UNAVAILABLE = "unavailable"
FIT_HOOKS = frozenset({FIT_HOOK_WAITING, FIT_HOOK_INSTALLED, FIT_HOOK_UNAVAILABLE})

# A note's ``level`` and ``topic``.
NOTE_INFO = "info"
NOTE_WARN = "warn"
NOTE_ERROR = "error"
NOTE_LEVELS = frozenset({NOTE_INFO, NOTE_WARN, NOTE_ERROR})
NOTE_TOPICS = frozenset({TOPIC_SHRUNK})  # notes the engine records as their own event

# A checkpointed message's ``reason``: why the checkpoint was saved.
SAVED_REQUEST = "request"
SAVED_PARK = "park"
SAVED_STOP = "stop"
SAVED_INTERVAL = "interval"
SAVED_EPOCH = "epoch"
SAVED_END = "end"
SAVED_OOM = "oom"  # before a relaunch at a smaller batch, after an out-of-memory error
SAVED_RELAUNCH = "relaunch"  # saved again at the relaunch's micro-batches, as it starts
SAVED_REASONS = frozenset(
    {
        SAVED_REQUEST,
        SAVED_PARK,
        SAVED_STOP,
        SAVED_INTERVAL,
        SAVED_EPOCH,
        SAVED_END,
        SAVED_OOM,
        SAVED_RELAUNCH,
    }
)
ENGINE_COMMANDS = frozenset({PAUSE, RESUME, CHECKPOINT, PARK, STOP, FIT})
# park: accumulation (optional) -- the job is relaunched at once at micro-batches of batch / N;
# the checkpoint is saved with that accumulation so the relaunch restores it as it was saved.


class ProtocolError(ValueError):
    """A message that is not valid JSON, not an object, too large, or of an unknown type."""


def encode(message):
    """A message (a dict with a ``type``) as bytes for ``send_bytes``."""
    data = json.dumps(message, separators=(",", ":"), allow_nan=False, default=str).encode("utf-8")
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError("message too large")
    return data


def decode(data, allowed=None):
    """Bytes from ``recv_bytes`` as a dict; raises ProtocolError on anything else.

    ``allowed``: the set of message types accepted (``JOB_MESSAGES`` on the engine side,
    ``ENGINE_COMMANDS`` in the runner).
    """
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError("message too large")
    try:
        message = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ProtocolError("not JSON: " + (str(e).splitlines() or ["?"])[0]) from None
    if not isinstance(message, dict):
        raise ProtocolError("not a JSON object")
    kind = message.get("type")
    if not isinstance(kind, str):
        raise ProtocolError("no message type")
    if allowed is not None and kind not in allowed:
        raise ProtocolError(f"unknown message type {kind!r}")
    return message


def make(kind, **fields):
    message = {"type": kind}
    message.update(fields)
    return message
