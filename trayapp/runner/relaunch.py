"""The job relaunched in a fresh process, in place of its own (``exec``), from its checkpoint at a
smaller micro-batch: where TensorFlow cannot be trusted to go on in this process.

An allocation that failed on the host (an address-space limit, ``ulimit -v``, a container's; a
``MemoryError``) leaves the process at the edge of what it may have: the step's tensors come back,
but the address space that the failed step's threads, buffers and allocator arenas took does not
all come back, and a step tried again in the same process fails where TensorFlow does not check
an allocation (a thread it starts, a C++ container, Eigen's and oneDNN's buffers) and ends the
job with SIGABRT or SIGSEGV, where plain Keras would have ended with ResourceExhaustedError. And a
failed step that may have touched the optimizer's state (the error inside its update) leaves
weights that no training can go on from. The fresh process is the same job to the engine: the
same process id, log and channel (it says hello again), the same interpreter, arguments, working
folder and environment as the job started with (resource limits included), with the options
changed to resume from the checkpoint folder at the smaller micro-batch.

POSIX only (``os.execv`` keeps the process there); never for a Jupyter kernel (it holds the
user's variables). Stdlib only.
"""

import json
import os
import sys

from . import protocol

_ORIGIN = {}  # type: dict


def remember(argv, environ, cwd):
    """What the job started with (``job.main``, before anything changes it): the runner's
    command line, its environment (the key file's variable still in it) and working folder."""
    _ORIGIN.clear()
    _ORIGIN.update(argv=list(argv), environ=dict(environ), cwd=cwd)


def possible():
    """Why the job cannot be relaunched in place (a sentence), or None."""
    if not _ORIGIN:
        return "a Jupyter kernel is not relaunched"
    if os.name != "posix" or not hasattr(os, "execve"):
        return "a job is relaunched in place on Linux and macOS only"
    return None


def _command():
    argv = list(getattr(sys, "orig_argv", None) or _ORIGIN["argv"])
    return sys.executable, [sys.executable] + argv[1:]


def _close_on_exec():
    """Every descriptor but the standard three closes with the exec (a GPU driver's among
    them: the fresh process gets the memory the old one held)."""
    try:
        import fcntl  # POSIX only, and only now
    except ImportError:  # pragma: no cover - not POSIX
        return
    try:
        names = os.listdir("/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd")
    except OSError:
        names = [str(fd) for fd in range(3, 1024)]
    for name in names:
        try:
            fd = int(name)
            if fd > 2:
                flags = fcntl.fcntl(fd, fcntl.F_GETFD)
                fcntl.fcntl(fd, fcntl.F_SETFD, flags | fcntl.FD_CLOEXEC)
        except (ValueError, OSError):
            pass


def relaunch(session, options):
    """Replace this process with the job started again with ``options``; returns only if that
    failed (with the reason)."""
    why = possible()
    if why is not None:
        return why
    executable, argv = _command()
    environ = dict(_ORIGIN["environ"])
    environ[protocol.ENV_OPTIONS] = json.dumps(options)
    session.channel.close(timeout=2.0)  # what waits is sent; no bye: the job goes on
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    _close_on_exec()
    try:
        os.chdir(_ORIGIN["cwd"])
        os.execve(executable, argv, environ)
    except OSError as e:
        return f"cannot start it again ({e.strerror or e})"
    return "cannot start it again"  # pragma: no cover - execve returns only by raising
