"""Inside the job: read the options, connect to the engine, run the user's script as ``__main__``.

Environment (names in ``protocol``): ``HEADROOM_JOB_OPTIONS`` (JSON, see ``tfoptions``),
``HEADROOM_JOB_ID``, ``HEADROOM_JOB_ADDRESS`` and ``HEADROOM_JOB_KEYFILE`` (a file whose bytes,
verbatim, are the channel's authentication key; the variable is removed before the script runs).
Without an address the job runs without a channel.

Options that need TensorFlow are applied the moment the script's ``import tensorflow`` (or the
``import keras`` that imports it) completes, before the script's next statement and before
TensorFlow starts its devices; precision when Keras is imported. The runner never imports
TensorFlow itself: a script that does not use it starts as fast as with ``python``, and what the
script sets up before its import (environment variables, logging) still counts. If an option
needs TensorFlow and it is not installed, the job ends at once with NO_TENSORFLOW_EXIT_CODE.

The script behaves as under ``python script.py``: ``sys.argv``, ``sys.path[0]``, ``__main__``,
``sys.exit`` codes, tracebacks (without the runner's frames) and exit status 1 on an uncaught
exception, and KeyboardInterrupt ending the process the way Python does.
"""

import json
import os
import runpy
import signal
import sys
import threading

from . import control, hooks, joblog, priority, protocol, relaunch, tfoptions
from .channel import Channel, NullChannel, start_small

RUNNER_VERSION = 1
NO_FIT_NOTE = "no Keras fit() seen: progress is not available"
_PACKAGE = __name__.rpartition(".")[0]
_TF_DISTRIBUTIONS = (
    "tensorflow",
    "tensorflow_cpu",
    "tensorflow_gpu",
    "tensorflow_intel",
    "tensorflow_macos",
    "tf_nightly",
    "tf_nightly_cpu",
)
_KERAS_DISTRIBUTIONS = ("keras", "tf_keras", "keras_nightly")


def _installed_version(module, distributions):
    """The version of the package that provides ``module``, from its ``*.dist-info`` folder name,
    without importing it (nor importlib.metadata, which costs more than the rest of the runner)."""
    import importlib.util  # the runner's start-up cost: only when a version is asked for

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    site = os.path.dirname(list(spec.submodule_search_locations)[0])
    try:
        names = os.listdir(site)
    except OSError:
        return None
    for name in sorted(names):
        if not name.endswith(".dist-info"):
            continue
        dist, _, version = name[: -len(".dist-info")].partition("-")
        if dist.lower().replace("-", "_").replace(".", "_") in distributions and version:
            return version
    return None


class Session:
    """Everything the runner knows about this job, shared by the hooks and the channel."""

    def __init__(self, options, job_id="", script="", exit_fn=os._exit):
        self.options = options
        self.job_id = job_id
        self.script = script
        self.channel = NullChannel()
        self.control = control.Control(self.send_state)
        self.active_run = None
        self.fit_count = 0
        self.fit_seen = False
        self.fit_hook = protocol.FIT_HOOK_WAITING
        self.applied = []
        self.tf_imported = False
        self.tf_version = None
        self.keras_version = None
        self.build_info = None
        self.tf_devices = None
        self._versions_read = False
        self._notes = set()
        self._finished = False
        self._lock = threading.Lock()
        self._exit = exit_fn
        self._timer = None

    # -- messages ---------------------------------------------------------------------------

    def send(self, message):
        self.channel.send(message)

    def send_progress(self, message, now=False):
        self.channel.send_progress(message, now)

    def send_state(self, state, **fields):
        self.channel.send(protocol.make(protocol.STATE, state=state, **fields))

    def note(self, level, message, once=True, topic=None):
        """Send a one-line note to the engine (each text once unless ``once`` is False);
        ``topic``: what it is about, when the engine records it as its own event."""
        if once:
            with self._lock:
                if message in self._notes:
                    return
                self._notes.add(message)
        fields = {"topic": topic} if topic else {}
        self.channel.send(protocol.make(protocol.NOTE, level=level, message=message, **fields))

    def hello(self):
        """The hello message as things stand now (built again on every reconnection)."""
        if not self._versions_read:
            self._versions_read = True
            self.tf_version = self.tf_version or _installed_version("tensorflow", _TF_DISTRIBUTIONS)
            self.keras_version = self.keras_version or _installed_version(
                "keras", _KERAS_DISTRIBUTIONS
            )
        import platform  # once, for the hello: kept off the runner's start-up

        return protocol.make(
            protocol.HELLO,
            job_id=self.job_id,
            pid=os.getpid(),
            python=sys.executable,
            python_version=platform.python_version(),
            script=self.script,
            runner_version=RUNNER_VERSION,
            options=self.options,
            applied=list(self.applied),
            tf_version=self.tf_version,
            keras_version=self.keras_version,
            tf_imported=self.tf_imported,
            build_info=self.build_info,
            tf_devices=self.tf_devices,
            fit_hook=self.fit_hook,
        )

    # -- commands from the engine (reader thread) -------------------------------------------

    def ask_fit(self, forecast, timeout):
        """Send a --fit-batch forecast; the engine's accumulation, or None (no engine, or no
        answer in ``timeout`` seconds)."""
        if not getattr(self.channel, "connected", False):
            self.send(forecast)
            return None
        return self.control.ask_fit(lambda: self.send(forecast), timeout)

    def on_command(self, message):
        kind = message["type"]
        if kind == protocol.FIT:
            k = message.get("accumulation")
            if isinstance(k, int) and not isinstance(k, bool) and 0 <= k <= 1024:
                self.control.fit_answered(k)
            return
        smaller = message.get("accumulation")
        if (
            kind == protocol.PARK
            and isinstance(smaller, int)
            and not isinstance(smaller, bool)
            and 1 < smaller <= 1024
        ):
            self.control.park_accumulation = smaller  # relaunched at once, smaller
        reply = self.control.request(kind)
        if kind == protocol.STOP and self.active_run is None:
            # "stopping" would say that fit() ends at its next batch; with no fit() running the
            # engine interrupts the script instead (a fit() that starts first ends at once).
            self.note(protocol.NOTE_INFO, "no Keras fit() running: the stop interrupts the script")
            return
        if reply:
            self.send_state(reply)
        if self.active_run is None and kind != protocol.RESUME:
            self.note(
                protocol.NOTE_INFO,
                f"no Keras fit() running: {kind} waits for the next training batch",
            )

    # -- import hooks (the importing thread) ------------------------------------------------

    def on_tensorflow(self, tf):
        self.tf_imported = True
        self.tf_version = getattr(tf, "__version__", None) or self.tf_version
        self.build_info = tfoptions.build_info(tf)
        try:
            self.applied.extend(tfoptions.apply_tensorflow(tf, self.options))
        except tfoptions.OptionError as e:
            self.fail_options(str(e))
        self._arm_no_fit_note()
        self.channel.hello_changed()

    def on_keras(self, keras):
        self.keras_version = getattr(keras, "__version__", None) or self.keras_version
        precision = self.options["precision"]
        if precision is not None:
            try:
                self.applied.append(tfoptions.apply_precision(keras, precision))
            except tfoptions.OptionError as e:
                self.fail_options(str(e))
        try:
            from . import fithook  # loaded with the script's runner; a kernel's, here

            hooked = fithook.install(keras, self)
        except Exception as e:
            hooked = False
            self.note(protocol.NOTE_WARN, f"cannot follow fit(): {e}")
        if hooked:
            self.fit_hook = protocol.FIT_HOOK_INSTALLED
        elif self.fit_hook != protocol.FIT_HOOK_INSTALLED:
            self.fit_hook = protocol.FIT_HOOK_UNAVAILABLE
        self._arm_no_fit_note()
        self.channel.hello_changed()

    def fail_options(self, message):
        """An option TensorFlow refused: say so in one line and end the job before it trains."""
        sys.stderr.write(f"headroom: {message}\n")
        sys.stderr.flush()
        self.note(protocol.NOTE_ERROR, message)
        self.finish(protocol.OPTIONS_EXIT_CODE)
        raise SystemExit(protocol.OPTIONS_EXIT_CODE)

    def _arm_no_fit_note(self):
        if self._timer is not None or self.fit_seen:
            return
        self._timer = threading.Timer(self.options["no_fit_note_seconds"], self._no_fit_yet)
        self._timer.daemon = True
        start_small(self._timer)

    def _no_fit_yet(self):
        if not self.fit_seen:
            self.note(protocol.NOTE_INFO, NO_FIT_NOTE)

    # -- fit() (training thread) ------------------------------------------------------------

    def next_fit_index(self):
        self.fit_count += 1
        return self.fit_count

    def fit_started(self, run):
        self.active_run = run
        if not self.fit_seen:
            self.fit_seen = True
            if self._timer is not None:
                self._timer.cancel()
            tf = sys.modules.get("tensorflow")
            if tf is not None:
                self.tf_devices = tfoptions.devices(tf)
            self.channel.hello_changed()

    def fit_ended(self, run):
        self.active_run = None

    def exit_parked(self):
        """End the process right after a parked fit() returns; nothing more of the script runs."""
        self._exit_now(protocol.PARK_EXIT_CODE, protocol.BYE_PARKED)

    def exit_stopped(self):
        """End the process right after a stopped fit() returns; nothing more of the script
        runs (it could overwrite what the user saved with a half-trained model)."""
        self._exit_now(protocol.STOP_EXIT_CODE, protocol.BYE_STOPPED)

    def _exit_now(self, code, reason):
        self.finish(code, reason=reason)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        self._exit(code)

    # -- the end ----------------------------------------------------------------------------

    def finish(self, exit_code, reason=None):
        """Send the last notes and ``bye`` (once), then close the channel."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
        if self._timer is not None:
            self._timer.cancel()
        if not self.fit_seen:
            self.note(protocol.NOTE_INFO, NO_FIT_NOTE)
        relaunched = self.options.get("relaunch") or {}
        if relaunched.get("temporary") and self.options.get("checkpoint_dir"):
            from .checkpoint import drop_checkpoints  # a fit was relaunched

            drop_checkpoints(self.options["checkpoint_dir"])
        if reason is None:
            reason = protocol.BYE_FINISHED if exit_code == 0 else protocol.BYE_ERROR
        bye = protocol.make(protocol.BYE, reason=reason, exit_code=exit_code)
        self.channel.close(final=bye, timeout=2.0)

    def forked(self):
        """In a child made by fork(): it is not the job; it reports nothing."""
        self.channel = NullChannel()
        self.control = control.Control(self.send_state)
        self._finished = True
        self._timer = None


# ---------------------------------------------------------------------------------------------


def _read_key():
    """(key bytes, problem) from the key file; the variable leaves the environment either way."""
    path = os.environ.pop(protocol.ENV_KEYFILE, None)
    if not path:
        return None, None
    try:
        with open(path, "rb") as f:
            key = f.read()
    except OSError as e:
        return None, f"{path}: {e.strerror or e}"
    if not key:
        return None, f"{path} is empty"
    return key, None


def _exit_status(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


def _is_runner_frame(frame, bootstrap_file):
    name = frame.f_globals.get("__name__", "")
    if name == "runpy" or name == _PACKAGE or name.startswith(_PACKAGE + "."):
        return True
    return bool(bootstrap_file) and frame.f_code.co_filename == bootstrap_file


def _user_traceback(tb, bootstrap_file):
    """The traceback without the runner's and runpy's frames, as ``python script.py`` shows."""
    kept = []
    while tb is not None:
        if not _is_runner_frame(tb.tb_frame, bootstrap_file):
            kept.append(tb)
        tb = tb.tb_next
    for a, b in zip(kept, kept[1:]):
        a.tb_next = b
    if kept:
        kept[-1].tb_next = None
        return kept[0]
    return None


def _print_exception(error, bootstrap_file):
    tb = _user_traceback(error.__traceback__, bootstrap_file)
    error.__traceback__ = tb
    try:
        sys.excepthook(type(error), error, tb)
    except Exception:
        import traceback  # only when the script's own excepthook failed

        traceback.print_exception(type(error), error, tb)
    try:
        sys.stderr.flush()
    except Exception:
        pass


def run_script(session, script, args, bootstrap_file=None):
    """Run the script as ``__main__``; returns when it ended with status 0, else exits."""
    path = os.path.abspath(script)
    if not os.path.exists(path):
        sys.stderr.write(
            f"{sys.executable}: can't open file {path!r}: [Errno 2] No such file or directory\n"
        )
        session.finish(2)
        sys.exit(2)
    sys.argv = [script] + list(args)
    if not getattr(sys.flags, "safe_path", False):
        folder = path if os.path.isdir(path) else os.path.dirname(os.path.realpath(path))
        sys.path.insert(0, folder)
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        session.finish(_exit_status(e.code))
        raise
    except KeyboardInterrupt as e:
        _print_exception(e, bootstrap_file)
        session.finish(-int(signal.SIGINT) if os.name == "posix" else 0xC000013A)
        # Python itself ends an interrupted script by re-raising SIGINT; let it, silently.
        sys.excepthook = lambda *args: None
        raise
    except BaseException as e:
        _print_exception(e, bootstrap_file)
        session.finish(1)
        sys.exit(1)
    session.finish(0)


def process_settings(text):
    """The job's process settings from ``protocol.ENV_PROCESS`` (JSON): ``nice``,
    ``oom_score_adj``, ``log``, ``log_max_bytes``, ``rlimits``, each None when absent or out of
    range. Never
    raises: a job runs even when they cannot be read."""
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}

    def whole(key, low, high):
        v = data.get(key)
        ok = isinstance(v, int) and not isinstance(v, bool) and low <= v <= high
        return v if ok else None

    log = data.get("log")
    limits = data.get("rlimits")
    return {
        "rlimits": limits if isinstance(limits, dict) else None,
        "nice": whole("nice", 0, 19),
        "oom_score_adj": whole("oom_score_adj", -1000, 1000),
        "log": log if isinstance(log, str) and log else None,
        "log_max_bytes": whole("log_max_bytes", 1, 1 << 50),
    }


def main(argv, bootstrap_file=None):
    """The runner's entry point: ``argv`` is ``[SCRIPT, *ARGS]`` (a kernel's, ``["--kernel",
    "-f", CONNECTION_FILE]``, goes to ``kernel.main``: bootstrap.py sends it there)."""
    if not argv:
        sys.stderr.write("usage: python bootstrap.py SCRIPT [ARGS...]\n")
        sys.exit(2)
    script, args = argv[0], argv[1:]
    # What a relaunch in a fresh process starts from (the key file's variable still set).
    relaunch.remember(
        [sys.executable, bootstrap_file or sys.argv[0], script] + list(args),
        os.environ,
        os.getcwd(),
    )
    # First, before any thread starts (threads and children take these from their creator):
    # the job's place below the desktop, and output that a full disk cannot turn into a crash.
    process = process_settings(os.environ.get(protocol.ENV_PROCESS))
    # The limits of the shell that ran headroom run, before TensorFlow reserves its space.
    problems = priority.apply_limits(process["rlimits"])
    problems += priority.apply(process["nice"], process["oom_score_adj"])
    output = joblog.guard_output(process["log"], process["log_max_bytes"])
    for problem in problems:
        sys.stderr.write(f"headroom: {problem}\n")
    try:
        options = tfoptions.read_options(os.environ.get(protocol.ENV_OPTIONS))
    except tfoptions.OptionError as e:
        sys.stderr.write(f"headroom: {e}\n")
        sys.exit(protocol.OPTIONS_EXIT_CODE)
    key, key_problem = _read_key()
    session = Session(options, os.environ.get(protocol.ENV_JOB_ID, ""), script)
    address = os.environ.get(protocol.ENV_ADDRESS)
    if key_problem:
        sys.stderr.write(
            f"headroom: cannot read the job key ({key_problem}): running without the engine\n"
        )
    elif address and key is not None:
        session.channel = Channel(address, key, session.on_command, session.hello)
        session.channel.start()
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=session.forked)
    for problem in problems:
        session.note(protocol.NOTE_WARN, problem)
    output.on_drop = lambda message: session.note(protocol.NOTE_WARN, message)

    missing = tfoptions.missing_requirement(options)
    if missing:
        sys.stderr.write(
            f"headroom: {missing} ({sys.executable}); "
            "install it there, or choose another --python\n"
        )
        session.note(protocol.NOTE_ERROR, missing)
        session.finish(protocol.NO_TENSORFLOW_EXIT_CODE)
        sys.exit(protocol.NO_TENSORFLOW_EXIT_CODE)

    hooks.ImportWatcher(
        {
            "tensorflow": session.on_tensorflow,
            "keras": session.on_keras,
            "tf_keras": session.on_keras,
        }
    ).install()
    run_script(session, script, args, bootstrap_file)
