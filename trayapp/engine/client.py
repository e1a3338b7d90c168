"""EngineClient: the one client of the control channel, for the tray and the CLI.

Blocking calls with timeouts; the tray calls them off its GUI thread. ``connect(start=True)``
starts an engine in the background when none runs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge
from typing import Any, Dict, List, Mapping, Optional

from trayapp import private
from trayapp.config import Paths
from trayapp.config.view import ConfigView
from trayapp.engine.checkpoint_record import CheckpointListing
from trayapp.engine.event_record import EngineEvent
from trayapp.engine.history_record import History
from trayapp.engine.protocol import MAX_MESSAGE_BYTES, encode, request
from trayapp.engine.status_record import Status
from trayapp.jobs.curves import JobCurves
from trayapp.jobs.logpages import LogPage
from trayapp.jobs.record import JobRecord, records
from trayapp.jsonvalue import JSONObject

WINDOWS = sys.platform == "win32"


class EngineUnavailable(Exception):
    """No engine answers at this state folder (exit status 3 in the CLI)."""


class EngineBusy(EngineUnavailable):
    """An engine runs at this state folder but did not take this client: it refused the
    connection (all its places are taken) or did not answer in time. Exit status 3, like
    EngineUnavailable, but it must never be reported as "no engine is running"."""


class EngineError(Exception):
    """The engine answered with an error; the message is one line for the user."""

    def __init__(self, message: str, code: str = "error"):
        super().__init__(message)
        self.code = code


# A refused connection is tried again for this long (a flood's churn can refuse one by chance).
BUSY_RETRY_SECONDS = 1.0
# An engine that a client starts answers within this, or it is said not to have started.
ENGINE_START_SECONDS = 20.0
START_POLL_SECONDS = 0.05


def _family() -> str:
    return "AF_PIPE" if WINDOWS else "AF_UNIX"


class UnsafeState(EngineUnavailable):
    """The runtime folder, the key or the socket is not safe to trust (another user's, a link,
    open to others): the client refuses to talk through it. Exit status 3, like no engine."""


def _read_key(paths: Paths) -> bytes:
    """The engine's key, once every level of the runtime folder, the key file and the socket
    proved to be the user's own and closed to others."""
    try:
        private.check_runtime(paths.data_dir, paths.runtime_dir)
        key = private.read_private(paths.key_file, limit=4096)
        if not WINDOWS:
            private.check_file(paths.control_address, private=True)
    except private.UnsafePath as e:
        raise UnsafeState(f"refusing to trust the engine's folder: {e}") from None
    except OSError:
        raise EngineUnavailable(f"no engine is running for {paths.home}") from None
    return key


def _open(paths: Paths, timeout: float) -> Connection:
    key = _read_key(paths)
    if not WINDOWS and not os.path.exists(paths.control_address):
        raise EngineUnavailable(f"no engine is running for {paths.home}")
    started = time.monotonic()
    delay = 0.05
    while True:
        try:
            return _attempt(paths, key, max(0.1, timeout - (time.monotonic() - started)))
        except _Refused:
            spent = time.monotonic() - started
            if spent + delay > min(BUSY_RETRY_SECONDS, timeout):
                raise _busy(paths) from None
            time.sleep(delay)
            delay *= 2


def _busy(paths: Paths) -> EngineBusy:
    return EngineBusy(f"the engine at {paths.home} is busy and refused the connection; try again")


class _Refused(Exception):
    """The engine took the connection, then closed it before the handshake ended."""


def _dial(address: str, key: bytes, sockets: List[Any]) -> Connection:
    """Connect and authenticate (POSIX). Raises FileNotFoundError/ConnectionRefusedError when
    nothing listens, _Refused when the engine closes the connection in the handshake,
    AuthenticationError for a wrong key. The socket goes into ``sockets`` so the caller can
    cut a handshake that does not end."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sockets.append(sock)
    sock.connect(address)
    conn = Connection(os.dup(sock.fileno()))
    try:
        answer_challenge(conn, key)
        deliver_challenge(conn, key)
    except AuthenticationError:
        conn.close()
        raise
    except (EOFError, OSError) as e:
        conn.close()
        raise _Refused() from e
    return conn


def _attempt(paths: Paths, key: bytes, timeout: float) -> Connection:
    """One try at a connection, within ``timeout``. Raises EngineUnavailable (nothing
    listens, wrong key), EngineBusy (no answer in time) or _Refused."""
    result: Dict[str, Any] = {}
    sockets: List[Any] = []

    # The handshake has no timeout of its own; a wedged engine must not hang the caller.
    def attempt() -> None:
        try:
            if WINDOWS:  # pragma: no cover - Windows only
                result["conn"] = Client(paths.control_address, family=_family(), authkey=key)
            else:
                result["conn"] = _dial(paths.control_address, key, sockets)
        except BaseException as e:  # noqa: BLE001 - handed to the caller below
            result["error"] = e

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(timeout)
    for sock in sockets:  # the thread's own socket: a stuck handshake ends with it
        try:
            if t.is_alive():
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        except OSError:
            pass
    if t.is_alive():
        raise EngineBusy(
            f"the engine at {paths.home} is busy and did not take the "
            f"connection in {timeout:.0f} s; try again"
        )
    err = result.get("error")
    if isinstance(err, AuthenticationError):
        raise EngineUnavailable("the engine refused this client (wrong key)")
    if isinstance(err, _Refused):
        raise err
    if err is not None:
        raise EngineUnavailable(f"no engine is running for {paths.home}")
    return result["conn"]


class EngineClient:
    """A connection for requests and answers. Thread-safe: one request at a time."""

    def __init__(self, paths: Paths, timeout: float = 10.0):
        self.paths = paths
        self.timeout = timeout
        self._conn: Optional[Connection] = None
        self._lock = threading.Lock()
        self._next_id = 0

    def _connection(self) -> Connection:
        if self._conn is None:
            self._conn = _open(self.paths, self.timeout)
        return self._conn

    def request(self, op: str, timeout: Optional[float] = None, **args: Any) -> Any:
        """Send one request; return its result. Raises EngineError (the engine said no) or
        EngineUnavailable (no engine, or it went away)."""
        args = {k: v for k, v in args.items() if v is not None}
        with self._lock:
            for attempt in (0, 1):
                conn = self._connection()
                self._next_id += 1
                req_id = self._next_id
                try:
                    conn.send_bytes(encode(request(req_id, op, args)))
                    answer = self._receive(conn, req_id, timeout or self.timeout)
                    break
                except (OSError, EOFError):
                    self.close_nolock()
                    # A connection the engine dropped (restart, or cut while idle) gets one
                    # fresh try; cut again, the engine runs but had no room for this client.
                    if op == "shutdown":
                        raise EngineUnavailable("the engine went away") from None
                    if attempt == 1:
                        raise EngineBusy(
                            f"the engine at {self.paths.home} is busy and cut "
                            "the connection; try again"
                        ) from None
        if not answer.get("ok"):
            raise EngineError(
                str(answer.get("error", "unknown error")), str(answer.get("code", "error"))
            )
        return answer.get("result")

    def _receive(self, conn: Connection, req_id: int, timeout: float) -> JSONObject:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not conn.poll(left):
                self.close_nolock()
                raise EngineBusy(
                    f"the engine at {self.paths.home} did not answer in time; try again"
                )
            msg = json.loads(conn.recv_bytes(MAX_MESSAGE_BYTES).decode("utf-8"))
            if isinstance(msg, dict) and msg.get("id") in (req_id, None) and "ok" in msg:
                return msg

    def close_nolock(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
            self._conn = None

    def close(self) -> None:
        with self._lock:
            self.close_nolock()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the requests -------------------------------------------------------------------------

    def ping(self) -> JSONObject:
        return self.request("ping")

    def status(self) -> Status:
        """The engine's status, read into a record (``status_record.Status``)."""
        return Status.from_json(self.request("status"))

    def history(
        self,
        start: float,
        end: Optional[float] = None,
        series: Optional[List[str]] = None,
        prefix: Optional[List[str]] = None,
    ) -> History:
        """The series asked for (by name, or every one under a prefix) between two times."""
        answer = self.request(
            "history",
            start=start,
            end=end,
            series=series,
            prefix=prefix,
            timeout=max(self.timeout, 30.0),
        )
        return History.from_json(answer)

    def events(
        self,
        since: Optional[float] = None,
        after_id: Optional[int] = None,
        job: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> List[EngineEvent]:
        """The events asked for, oldest first (what is not an event is left out)."""
        found = self.request("events", since=since, after_id=after_id, job=job, limit=limit)
        events = (EngineEvent.from_json(e) for e in (found if isinstance(found, list) else ()))
        return [e for e in events if e is not None]

    def config_get(self) -> ConfigView:
        return ConfigView.from_json(self.request("config_get"))

    def config_set(self, name: str, value: Any, version: Optional[str] = None) -> ConfigView:
        """Save one setting; with ``version`` (``config_get().version``), an EngineError with
        code "conflict" when the file changed since then, and nothing is written."""
        return ConfigView.from_json(
            self.request("config_set", name=name, value=value, version=version)
        )

    def guard_mode(self, mode: str) -> ConfigView:
        return ConfigView.from_json(self.request("guard_mode", mode=mode))

    def shutdown(self, force: bool = False) -> Any:
        return self.request("shutdown", force=force)

    def jobs(self, all: bool = False) -> List[JobRecord]:
        """The engine's jobs (with ``all``, the ended ones too), as records."""
        return records(self.request("jobs", all=all))

    def job_get(self, job: str) -> JobRecord:
        """The job's record (by id, unique id prefix or unique name)."""
        return _job(self.request("job_get", job=job))

    def job_curves(self, job: str) -> JobCurves:
        """The job's loss and metric curves (``jobs.curves.JobCurves``)."""
        answer = self.request("job_get", job=job, curves=True)
        return JobCurves.from_json(answer.get("curves") if isinstance(answer, dict) else None)

    def job_start(
        self,
        spec: Mapping[str, Any],
        environ: Optional[Mapping[str, str]] = None,
        env_from: Optional[str] = None,
    ) -> JobRecord:
        """Launch a job; ``environ`` is the environment it starts from (default: the
        engine's). ``env_from``: the job whose kept ``--env`` values fill ``spec``'s hidden ones
        (a spec from ``jobs`` shows each value as None)."""
        return _job(
            self.request(
                "job_start",
                spec=dict(spec),
                environ=dict(environ) if environ is not None else None,
                env_from=env_from,
                timeout=max(self.timeout, 30.0),
            )
        )

    def job_action(self, job: str, action: str, reason: Optional[str] = None) -> JobRecord:
        """Act on a job (pause, resume, park, stop, kill, interrupt); its record after."""
        return _job(
            self.request(
                "job_action",
                job=job,
                action=action,
                reason=reason,
                timeout=max(self.timeout, 60.0),
            )
        )

    def job_log(
        self, job: str, offset: Optional[int] = None, max_bytes: Optional[int] = None
    ) -> LogPage:
        """A page of the job's log (``jobs.logpages.read_page``)."""
        return LogPage.from_json(
            self.request("job_log", job=job, offset=offset, max_bytes=max_bytes)
        )

    def job_checkpoints(self, job: str) -> CheckpointListing:
        """The job's checkpoints (``engine.checkpoints.list_checkpoints``)."""
        return CheckpointListing.from_json(self.request("job_checkpoints", job=job))

    def job_checkpoint_delete(self, job: str, checkpoint: str) -> Any:
        """Delete one of the job's checkpoints (its ``fit-<n>`` name or path); the answer is
        ``{"deleted": name, "kept": [names left]}``."""
        return self.request("job_checkpoint_delete", job=job, checkpoint=checkpoint)

    def pause_all(self) -> List[JobRecord]:
        """Pause every running job; the records of those paused."""
        return records(self.request("jobs_pause_all"))


def _job(answer: Any) -> JobRecord:
    """The job an answer holds; EngineError when it holds none."""
    try:
        return JobRecord.from_json(answer)
    except ValueError:
        raise EngineError("the engine's answer is not a job", "bad_answer") from None


class Subscription:
    """A separate connection that receives pushes: ``get(timeout)`` returns the next one
    (``{"push": "snapshot" | "event", "data": ...}``) or None on timeout. Raises
    EngineUnavailable when the engine goes away."""

    def __init__(
        self, paths: Paths, snapshots: bool = True, events: bool = True, timeout: float = 10.0
    ):
        self._conn = _open(paths, timeout)
        try:
            self._conn.send_bytes(
                encode(request(1, "subscribe", {"snapshots": snapshots, "events": events}))
            )
            if not self._conn.poll(timeout):
                raise EngineUnavailable("the engine did not answer in time")
            answer = json.loads(self._conn.recv_bytes(MAX_MESSAGE_BYTES).decode("utf-8"))
        except (OSError, EOFError):
            self.close()
            raise EngineUnavailable("the engine went away") from None
        if not answer.get("ok"):
            self.close()
            raise EngineError(str(answer.get("error")))
        self.initial = answer.get("result") or {}

    def get(self, timeout: Optional[float] = None) -> Optional[JSONObject]:
        try:
            if not self._conn.poll(timeout):
                return None
            msg = json.loads(self._conn.recv_bytes(MAX_MESSAGE_BYTES).decode("utf-8"))
        except (OSError, EOFError, ValueError):
            self.close()
            raise EngineUnavailable("the engine went away") from None
        return msg if isinstance(msg, dict) else None

    def close(self) -> None:
        try:
            self._conn.close()
        except OSError:
            pass

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -- starting an engine -------------------------------------------------------------------------


def engine_command(demo: bool = False, config_file: Optional[str] = None) -> List[str]:
    """The argv that starts an engine (the frozen executable, or this Python with -m)."""
    if getattr(sys, "frozen", False):
        argv = [sys.executable]
    else:
        argv = [sys.executable, "-m", "trayapp"]
    if config_file:
        argv += ["--config", config_file]
    if demo:
        argv.append("--demo")
    argv.append("engine")
    return argv


def start_engine(
    paths: Paths, demo: bool = False, config_file: Optional[str] = None
) -> subprocess.Popen[bytes]:
    """Start an engine in the background, detached from this terminal and this process."""
    kwargs: Dict[str, Any] = {}
    if WINDOWS:  # pragma: no cover
        flags = subprocess.CREATE_NEW_PROCESS_GROUP  # type: ignore[attr-defined]
        kwargs["creationflags"] = flags | subprocess.CREATE_NO_WINDOW  # type: ignore[attr-defined]
    else:
        kwargs["start_new_session"] = True
    return subprocess.Popen(
        engine_command(demo, config_file),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
        env={**os.environ, **private.umask_env()},
        **kwargs,
    )


def start_and_wait(
    paths: Paths,
    client: EngineClient,
    demo: bool = False,
    config_file: Optional[str] = None,
    timeout: float = ENGINE_START_SECONDS,
    halt: Optional[threading.Event] = None,
) -> subprocess.Popen[bytes]:
    """Start an engine and wait until ``client`` reaches it, or reaches another one that won the
    race for the state folder. Returns the process started (a thread reaps it when it ends).

    Raises UnsafeState, or EngineUnavailable when the engine exits with an error, does not
    answer within ``timeout`` seconds, or ``halt`` is set meanwhile."""
    proc = start_engine(paths, demo=demo, config_file=config_file)
    # The engine outlives its client's purpose but may end while this process runs: reap it
    # then, so it leaves no zombie behind.
    threading.Thread(target=proc.wait, name="headroom-engine-reaper", daemon=True).start()
    deadline = time.monotonic() + timeout
    halt = halt or threading.Event()
    while not halt.wait(START_POLL_SECONDS):
        try:
            client.ping()
            return proc
        except UnsafeState:
            raise
        except EngineUnavailable:
            rc = proc.poll()
            # 0: another engine won the race for the lock; keep trying to reach that one.
            if rc not in (None, 0):
                raise EngineUnavailable(
                    f"the engine could not start (exit status {rc}); see {paths.log_file}"
                ) from None
            if time.monotonic() > deadline:
                raise EngineUnavailable(
                    f"the engine did not start in {timeout:.0f} s; see {paths.log_file}"
                ) from None
    raise EngineUnavailable("stopped")


def connect(
    paths: Paths,
    start: bool = False,
    demo: bool = False,
    config_file: Optional[str] = None,
    timeout: float = ENGINE_START_SECONDS,
) -> EngineClient:
    """A client of a running engine; with ``start``, one is started when none answers.

    Raises EngineUnavailable when none answers (within ``timeout`` after starting one).
    """
    client = EngineClient(paths)
    try:
        client.ping()
        return client
    except EngineBusy:
        raise  # one runs: starting another would not help
    except UnsafeState:
        raise
    except EngineUnavailable:
        if not start:
            raise
    try:
        # The engine would refuse this state folder; say why here, where the user reads it.
        paths.ensure()
    except private.UnsafePath as e:
        raise UnsafeState(f"refusing to start an engine: {e}") from None
    except OSError:
        pass  # the engine says what it cannot make, in its log
    start_and_wait(paths, client, demo=demo, config_file=config_file, timeout=timeout)
    return client
