"""Kernel mode: ``python bootstrap.py --kernel -f CONNECTION_FILE``, a Jupyter kernel as a job.

Jupyter starts the kernel from the spec that ``headroom kernel install`` wrote; the engine did
not. So the runner applies the memory options (``HEADROOM_JOB_OPTIONS``, as for a script, at the
kernel's ``import tensorflow``), registers the kernel with the engine from a background thread
(``Adopter``: the engine's control channel, found as ``engine_home`` says, asked to ``adopt``
this process; it answers with the job's own channel), then runs ``ipykernel_launcher`` as
``__main__``. Without an engine the kernel starts all the same and registers once one runs.

The kernel's ladder differs from a script's: a park becomes "interrupt the fit" (at the next
batch end: a checkpoint, then ``KeyboardInterrupt`` in the cell; the kernel and its variables
stay), and a stop ends the kernel. A fit finds its checkpoint by what it is, not by the order of
cells: ``fit_fingerprint``.
"""

import json
import os
import re
import runpy
import sys
import threading
import time

from . import engine_home, hooks, job, priority, protocol, tfoptions
from .channel import Channel, start_small
from .control import Control

ENV_KERNEL = "HEADROOM_KERNEL"  # JSON {"v": 1, "name": NAME, "spec": {the engine's job spec}}
IDLE = protocol.STATE_IDLE  # the runner's state between fit() calls: nothing to interrupt
ADOPT_OP = "kernel_adopt"
RETRY_SECONDS = 1.0  # how often an unregistered kernel looks for an engine, at first ...
RETRY_MAX_SECONDS = 5.0  # ... and at most this far apart (one stat() of the socket a try)
REASK_SECONDS = 10.0  # a channel down this long: ask again (an engine that lost the job)
REQUEST_TIMEOUT_SECONDS = 10.0
FIRST_TRY_SECONDS = 5.0  # the first request waits for ipykernel to be up, at most this long
MAX_NAME = 200
INTERRUPTED = (
    "Headroom interrupted this fit(){saved}: the guard, as memory ran low, or you (Interrupt "
    "fit, headroom park). The kernel and its variables are kept; TensorFlow keeps the GPU "
    "memory it holds until the kernel restarts. Run the same fit() again (the same model and "
    "arguments, in this kernel or after a restart) to go on from {where}."
)
CONTINUED = "Headroom: this fit() goes on from its checkpoint at epoch {epoch} ({folder})"
_AUTO_MODEL_NAME = re.compile(r"^(sequential|functional|model)(_\d+)?$")
_FIT_ARGS = (
    "epochs",
    "batch_size",
    "steps_per_epoch",
    "validation_split",
    "validation_steps",
    "initial_epoch",
    "shuffle",
)


# -- the kernel's name and spec -------------------------------------------------------------------


def kernel_name(environ, connection_file, now=None):
    """The job's name: the notebook Jupyter says it runs (``JPY_SESSION_NAME``, a path), else
    the kernel spec's display name with the time it started ("Python 3 (Headroom) 14:05": a
    kernel started by jupyter_client or nbconvert has only a temporary connection file, whose
    name says nothing)."""
    session = (environ.get("JPY_SESSION_NAME") or "").strip()
    if session:
        return os.path.basename(session.rstrip("/\\"))[:MAX_NAME] or session[:MAX_NAME]
    spec = read_kernel(environ.get(ENV_KERNEL))
    shown = spec.get("display_name") or spec.get("name")
    shown = shown.strip() if isinstance(shown, str) else ""
    at = time.strftime("%H:%M", time.localtime(now))
    return f"{shown[: MAX_NAME - 6] or 'kernel'} {at}"


def read_kernel(text):
    """The ``HEADROOM_KERNEL`` object, or {} when absent or unreadable (the kernel then
    registers with no budgets of its own; the engine checks every field again)."""
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _slug(text):
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")[:80] or "kernel"


# -- checkpoint matching --------------------------------------------------------------------------


def _stable(value):
    """JSON-able ``value`` with objects as their type's name (never a repr with an address)."""
    return json.loads(json.dumps(value, sort_keys=True, default=lambda o: type(o).__name__))


def _config(obj):
    try:
        config = obj.get_config()
    except Exception:
        return {}
    if not isinstance(config, dict):
        return {}
    return {k: v for k, v in config.items() if k != "name"}


def _data_shape(value, depth=0):
    """What a fit's ``x`` or ``y`` looks like: shapes and dtypes, not the values."""
    if depth > 3 or value is None:
        return None
    shape = getattr(value, "shape", None)
    if shape is not None:
        return [
            type(value).__name__,
            [
                d if isinstance(d, int) else None
                for d in (tuple(shape) if shape is not None else ())
            ],
            str(getattr(value, "dtype", "")),
        ]
    if isinstance(value, dict):
        return {str(k): _data_shape(v, depth + 1) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [_data_shape(v, depth + 1) for v in value[:16]]
    spec = getattr(value, "element_spec", None)  # a tf.data.Dataset
    return [type(value).__name__, str(spec) if spec is not None else None]


def fit_fingerprint(model, arguments):
    """A short hash of what makes a fit the same fit in a notebook: the model's class and
    layers (class and configuration, without the names Keras numbers as cells run again), its
    own name when the user gave one, its optimizer, and the fit's arguments and data shapes.
    The same cell run again, or after a restart, gives the same hash."""
    name = str(getattr(model, "name", "") or "")
    layers = [
        [type(layer).__name__, _config(layer)]
        for layer in list(getattr(model, "layers", None) or [])
    ]
    optimizer = getattr(model, "optimizer", None)
    what = {
        "model": [type(model).__name__, "" if _AUTO_MODEL_NAME.match(name) else name, layers],
        "optimizer": [type(optimizer).__name__, _config(optimizer)] if optimizer else None,
        "fit": {k: arguments.get(k) for k in _FIT_ARGS if k in arguments},
        "data": [_data_shape(arguments.get("x")), _data_shape(arguments.get("y"))],
    }
    text = json.dumps(_stable(what), sort_keys=True, separators=(",", ":"))
    import hashlib  # at a fit, not at the kernel's start

    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# -- the session ----------------------------------------------------------------------------------


class KernelSession(job.Session):
    """The runner's session in a kernel: many fits, one after the other, and the kernel's
    ladder (interrupt instead of park; a stop ends the kernel)."""

    def __init__(self, options, name, notebook_known, exit_fn=os._exit):
        super().__init__(dict(options, resume=True), "", name, exit_fn=exit_fn)
        self.name = name
        self._folder = _slug(name) if notebook_known else "kernel"
        self.interrupts = 0

    def fit_folder(self, model, arguments):
        """The checkpoint folder of this fit: ``<checkpoint_dir>/<notebook>/fit-<fingerprint>``."""
        base = self.options["checkpoint_dir"]
        if not base:
            return None
        try:
            fingerprint = fit_fingerprint(model, arguments)
        except Exception as e:  # a model that cannot be read: the fit goes on without a match
            self.note(protocol.NOTE_WARN, f"cannot tell this fit() apart from others: {e}")
            return None
        return os.path.join(base, self._folder, "fit-" + fingerprint)

    def fit_started(self, run):
        self.last_run = run
        super().fit_started(run)
        self.send_state(protocol.STATE_RUNNING)
        metadata = run.read_metadata() if run.dir else None
        extra = (metadata or {}).get("headroom")
        epoch = (metadata or {}).get("epoch")
        if isinstance(extra, dict) and not extra.get("finished") and isinstance(epoch, int):
            # Said in the cell: Keras's first line is then "Epoch 30/40", with no why.
            print(CONTINUED.format(epoch=epoch + 1, folder=run.dir), flush=True)

    def fit_ended(self, run):
        super().fit_ended(run)
        if run.dir and not self.control.park and not run.stopping:
            metadata = run.read_metadata() or {}
            extra = metadata.get("headroom")
            if isinstance(extra, dict) and extra.get("finished") is True:
                # Done: running the cell again trains again, from the model as it is.
                from . import checkpoint

                checkpoint.drop_checkpoint(run.dir)
        self.send_state(IDLE)

    def on_command(self, message):
        kind = message["type"]
        if self.active_run is None:
            if kind == protocol.PARK:
                self.send_state(IDLE)
                self.note(protocol.NOTE_INFO, "no fit() running: nothing to interrupt", once=False)
                return
            if kind == protocol.STOP:
                self.shut_down()
                return
            if kind in (protocol.PAUSE, protocol.RESUME, protocol.CHECKPOINT):
                self.control.request(kind)  # the engine suspends an idle kernel's tree
                return
        super().on_command(message)

    def exit_parked(self):
        """The fit was interrupted at a batch end (and saved, with a checkpoint folder): the
        kernel lives on, the cell gets ``KeyboardInterrupt``."""
        run_dir = self._last_dir
        self.control = Control(self.send_state)  # the next fit() starts clean
        self.interrupts += 1
        self.send_state(IDLE)
        saved = (
            f" (checkpoint in {run_dir})" if run_dir else " (no checkpoint folder: nothing saved)"
        )
        where = "its checkpoint" if run_dir else "the weights the model holds now"
        raise KeyboardInterrupt(INTERRUPTED.format(saved=saved, where=where))

    def shut_down(self):
        """A stop with no fit() running: the kernel ends (its last resort)."""
        self.note(protocol.NOTE_INFO, "stopped: the kernel shuts down")
        self._exit_now(protocol.STOP_EXIT_CODE, protocol.BYE_STOPPED)

    @property
    def _last_dir(self):
        run = self.last_run
        return run.dir if run is not None and run.dir and os.path.isdir(run.dir) else None

    last_run = None  # the last fit's run (its checkpoint folder, for the interrupt)


# -- registering with the engine ------------------------------------------------------------------


def _hex(value, most):
    if isinstance(value, str) and 0 < len(value) <= most and re.fullmatch(r"[0-9a-f]+", value):
        return value
    return None


def parse_adopted(result):
    """(job id, address, key bytes) from the engine's answer, or None when it is not one."""
    if not isinstance(result, dict):
        return None
    job_id, key = _hex(result.get("job"), 32), _hex(result.get("key"), 512)
    address = result.get("address")
    if (
        not job_id
        or not key
        or len(key) % 2
        or not isinstance(address, str)
        or not 0 < len(address) <= 400
        or not address.isprintable()
    ):
        return None
    return job_id, address, bytes.fromhex(key)


def _connect(address, key, timeout):
    """An authenticated control connection; a handshake that hangs is cut after ``timeout``."""
    import socket  # the Adopter's thread: after the kernel's start
    from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge

    if sys.platform == "win32":  # pragma: no cover - Windows: a named pipe
        return Client(address, authkey=key), None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(address)
    sock.settimeout(None)
    conn = Connection(os.dup(sock.fileno()))
    timer = threading.Timer(timeout, lambda: _cut(sock))
    timer.daemon = True
    start_small(timer)
    try:
        answer_challenge(conn, key)
        deliver_challenge(conn, key)
    except BaseException:
        timer.cancel()
        conn.close()
        sock.close()
        raise
    return conn, (sock, timer)


def _cut(sock):
    import socket

    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def ask_engine(args, environ=None, timeout=REQUEST_TIMEOUT_SECONDS):
    """Send one ``kernel_adopt`` request; the engine's result, or None (no engine, no key, a
    refusal, no answer in time)."""
    address, keyfile = engine_home.control(environ)
    if sys.platform != "win32" and not os.path.exists(address):
        return None
    key = engine_home.read_key(keyfile)
    if key is None:
        return None
    try:
        conn, hold = _connect(address, key, timeout)
    except Exception:
        return None
    try:
        conn.send_bytes(json.dumps({"id": 1, "op": ADOPT_OP, "args": args}).encode("utf-8"))
        if not conn.poll(timeout):
            return None
        answer = json.loads(conn.recv_bytes(protocol.MAX_MESSAGE_BYTES).decode("utf-8"))
    except Exception:
        return None
    finally:
        conn.close()
        if hold is not None:
            hold[1].cancel()
            hold[0].close()
    if not isinstance(answer, dict) or answer.get("ok") is not True:
        if isinstance(answer, dict) and isinstance(answer.get("error"), str):
            sys.stderr.write(
                f"headroom: the engine did not take this kernel: {answer['error'][:300]}\n"
            )
        return None
    return answer.get("result")


class Adopter:
    """Registers the kernel with the engine, in the background, as often as needed: at start,
    when an engine starts later, and when the engine that knew the kernel is gone for good."""

    def __init__(self, session, args, environ=None):
        self.session = session
        self.args = args
        self.environ = environ
        self.adopted = None  # (job id, address, key)
        self.refused = 0
        self._lost_since = None
        self._stop = threading.Event()
        self.kernel_up = threading.Event()  # set when ipykernel serves (``when_kernel_up``)

    def start(self):
        start_small(threading.Thread(target=self._run, name="headroom-adopt", daemon=True))

    def stop(self):
        self._stop.set()

    def _run(self):
        # Off the kernel's start: Jupyter waits for the kernel, not for its registration.
        self.kernel_up.wait(FIRST_TRY_SECONDS)
        delay = RETRY_SECONDS
        while not self._stop.is_set():
            if self.needed(time.monotonic()):
                delay = RETRY_SECONDS if self._try() else min(delay * 2, RETRY_MAX_SECONDS)
            else:
                delay = RETRY_SECONDS
            self._stop.wait(delay)

    def needed(self, now):
        if self.adopted is None:
            return True
        if getattr(self.session.channel, "connected", False):
            self._lost_since = None
            return False
        # The same engine coming back reconnects on its own; one that lost the job does not.
        if self._lost_since is None:
            self._lost_since = now
        return now - self._lost_since >= REASK_SECONDS

    def _try(self):
        """``try_once``, never ending the thread: whatever an answer makes go wrong is a try
        that failed (the kernel asks again, and registers once an engine answers right)."""
        try:
            return self.try_once()
        except Exception as e:
            self.refused += 1
            sys.stderr.write(
                f"headroom: registering with the engine failed ({type(e).__name__}: "
                f"{str(e)[:200]}); trying again\n"
            )
            return False

    def try_once(self):
        adopted = parse_adopted(ask_engine(self.args, self.environ))
        if adopted is None:
            self.refused += 1
            return False
        self._lost_since = None
        if adopted == self.adopted:
            return True
        job_id, address, key = adopted
        old = self.session.channel
        self.session.job_id = job_id
        channel = Channel(address, key, self.session.on_command, self.session.hello)
        self.session.channel = channel
        channel.start()
        old.close(timeout=0)
        self.adopted = adopted  # last: registered means the new channel is the session's
        return True


def when_kernel_up(kernelapp, event):
    """Set ``event`` when ipykernel's app (module ``kernelapp``, just imported) has bound its
    sockets and starts serving; at once when that cannot be told."""
    app = getattr(kernelapp, "IPKernelApp", None)
    original = getattr(app, "start", None)
    if not callable(original):
        event.set()
        return

    def start(self, *args, **kwargs):
        event.set()
        return original(self, *args, **kwargs)

    try:
        app.start = start
    except (AttributeError, TypeError):
        event.set()


# -- the entry point ------------------------------------------------------------------------------


def _connection_file(argv):
    for i, arg in enumerate(argv):
        if arg == "-f" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--f="):
            return arg[4:]
    return None


def _start(argv, environ):
    """Process settings, options and the session, before anything of the kernel runs."""
    process = job.process_settings(environ.get(protocol.ENV_PROCESS))
    for problem in priority.apply(process["nice"], process["oom_score_adj"]):
        sys.stderr.write(f"headroom: {problem}\n")
    try:
        options = tfoptions.read_options(environ.get(protocol.ENV_OPTIONS))
    except tfoptions.OptionError as e:
        sys.stderr.write(f"headroom: {e}\n")
        sys.exit(protocol.OPTIONS_EXIT_CODE)
    connection = _connection_file(argv) or ""
    name = kernel_name(environ, connection)
    session = KernelSession(options, name, bool(environ.get("JPY_SESSION_NAME")))
    missing = tfoptions.missing_requirement(options)
    if missing:  # a notebook without TensorFlow still gets its kernel; the options wait
        sys.stderr.write(f"headroom: {missing} ({sys.executable})\n")
    return session, connection


def adopt_args(session, environ, connection):
    """The ``kernel_adopt`` request's arguments for this process."""
    return {
        "pid": os.getpid(),
        "name": session.name,
        "kernel": read_kernel(environ.get(ENV_KERNEL)),
        "connection_file": os.path.abspath(connection)[:1000] if connection else None,
    }


def main(argv, bootstrap_file=None):
    """``argv``: the kernel's arguments (``-f CONNECTION_FILE``), as ``ipykernel`` takes them."""
    environ = os.environ
    session, connection = _start(argv, environ)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=session.forked)
    adopter = Adopter(session, adopt_args(session, environ, connection))
    hooks.ImportWatcher(
        {
            "tensorflow": session.on_tensorflow,
            "keras": session.on_keras,
            "tf_keras": session.on_keras,
            "ipykernel.kernelapp": lambda m: when_kernel_up(m, adopter.kernel_up),
        }
    ).install()
    adopter.start()
    sys.argv = ["ipykernel_launcher"] + list(argv)
    if not getattr(sys.flags, "safe_path", False):
        sys.path.insert(0, os.getcwd())  # as ``python -m ipykernel_launcher`` has it
    try:
        runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
    except ImportError as e:
        if getattr(e, "name", None) not in ("ipykernel_launcher", "ipykernel"):
            raise
        sys.stderr.write(
            f"headroom: ipykernel is not installed for {sys.executable}; install "
            f"it there with: {sys.executable} -m pip install ipykernel\n"
        )
        session.finish(1)
        sys.exit(1)
    except SystemExit as e:
        session.finish(job._exit_status(e.code))
        raise
    except BaseException:
        session.finish(1)
        raise
    finally:
        adopter.stop()
    session.finish(0)
