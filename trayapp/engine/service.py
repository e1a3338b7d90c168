"""The engine: sample -> store -> guard -> act -> publish, and the control channel's requests.

One engine per state folder (an OS lock that dies with the process). No Qt, no numpy: it must
stay small and answer while the machine is nearly out of memory.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from trayapp import __version__, channel
from trayapp import config as configmod
from trayapp.channel import ChannelServer, Peer
from trayapp.config import Config, ConfigConflict, Paths
from trayapp.engine import checkpoints, protocol
from trayapp.engine.config_watch import ConfigWatcher, shown_problems
from trayapp.engine.event_record import EngineEvent
from trayapp.engine.guarding import ConfigPolicy, GuardService
from trayapp.engine.history import ConsumerScan, RecentHistory
from trayapp.engine.metrics import MetricsService
from trayapp.engine.own_process import EngineLock, harden_process, rlimits_json
from trayapp.engine.parts import Parts
from trayapp.engine.status_record import EngineView, GuardView, Status
from trayapp.engine.store import Store
from trayapp.errors import Refused, Unknown
from trayapp.jobs.envfile import hide_stored
from trayapp.jobs.manager import JobManager
from trayapp.jobs.record import JobRecord
from trayapp.jsonvalue import JSONObject
from trayapp.probes.consumers import ram_by_name
from trayapp.probes.gpu import GpuBackend, make_backend
from trayapp.probes.memory import MemoryProbe, PsutilMemoryProbe, make_memory_probe
from trayapp.probes.processes import ProcessSampler
from trayapp.readings import GpuReading, Snapshot
from trayapp.request_args import Args, Handlers
from trayapp.series import memory_only, pid_owners, process_values
from trayapp.series import sample_values as series_values
from trayapp.text import one_line
from trayapp.vocab import EventKind as E
from trayapp.vocab import GuardLevel

log = logging.getLogger("headroom.engine")

GPU_MIN_INTERVAL = 1.0  # NVML is read at most once a second
STORE_FLUSH_INTERVAL = 1.0  # WAL without fsync per commit: cheap, and a crash loses at most 1 s


# -- the engine ---------------------------------------------------------------------------------


def sample_values(snap: Snapshot, jobs: List[Any]) -> Dict[str, Optional[float]]:
    """One snapshot as named series for the history (``trayapp.series``)."""
    return series_values(snap.memory, snap.gpus, jobs)


class Engine:
    """The guardian process. ``run()`` blocks until stopped; everything else is thread-safe."""

    def __init__(
        self,
        paths: Paths,
        config: Config,
        *,
        demo: bool = False,
        stay: bool = False,
        memory_probe: Optional[Union[MemoryProbe, PsutilMemoryProbe]] = None,
        gpu_backend: Optional[GpuBackend] = None,
        clock: Callable[[], float] = time.time,
        metrics: Optional[str] = None,
    ):
        self.paths = paths
        self.config = config
        self.demo = demo
        self.stay = stay
        self.clock = clock
        self._memory_probe = memory_probe
        self._gpu_backend = gpu_backend
        self.started = clock()
        self.latest: Optional[Snapshot] = None
        self.recent = RecentHistory()
        self.consumers = ConsumerScan(ram_by_name)  # RAM by process name, for the dashboard
        self.lock = EngineLock(paths.lock_file)
        self.server: Optional[ChannelServer] = None
        self.store: Optional[Store] = None
        self.jobs: Optional[JobManager] = None
        self.guard: Optional[GuardService] = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._state_lock = threading.RLock()
        self._gpus: Tuple[GpuReading, ...] = ()
        self._gpu_read_at = 0.0
        self._last_publish = 0.0
        self._last_flush = 0.0
        self._idle_since = time.monotonic()
        self._exit_reason = "stopped"
        self._store_error: Optional[str] = None
        self.config_watch = ConfigWatcher(self)
        # The Prometheus exporter: ``metrics`` is --metrics's [ADDR:]PORT (over the setting).
        self.metrics = MetricsService(lambda: self.config, metrics)
        self.metrics_flag = metrics
        self._parts = Parts(log)  # the parts of a tick, each on its own
        self.handlers: Handlers = {
            "ping": self._op_ping,
            "status": lambda peer, a: self.status(),
            "history": self._op_history,
            "events": self._op_events,
            "subscribe": self._op_subscribe,
            "config_get": lambda peer, a: self._config_json(),
            "config_set": self._op_config_set,
            "guard_mode": self._op_guard_mode,
            "shutdown": self._op_shutdown,
        }

    # -- set-up -------------------------------------------------------------------------------

    def _open_parts(self) -> None:
        if self._memory_probe is None:
            self._memory_probe = make_memory_probe()
        if self._gpu_backend is None:
            self._gpu_backend = make_backend(demo=self.demo)
        self.store = Store(
            self.paths.db_file,
            raw_hours=self.config["history.raw_hours"],
            keep_days=self.config["history.keep_days"],
        )
        if self.store.recovered_from is not None:
            log.warning(
                "the history database was damaged; moved aside to %s and started anew",
                self.store.recovered_from,
            )
        self._attach_jobs()
        self._attach_guard()

    def _attach_jobs(self) -> None:
        assert self.store is not None
        self.jobs = JobManager(
            self.paths,
            self.store,
            emit=self.emit_event,
            gpus=lambda: self._gpus,
            config=lambda: self.config,
            wake=self.wake,
        )
        if hide_stored(self.store, self.paths.jobs_dir):  # saved by an older Headroom
            log.info("environment values of older jobs moved out of the database")
        self.handlers.update(self.jobs.handlers())
        self.handlers.update(checkpoints.handlers(self.jobs.get))
        self.jobs.adopt()

    def _attach_guard(self) -> None:
        self.guard = GuardService(
            jobs=self._guard_jobs,
            acts=self.jobs,
            emit=self.emit_event,
            read_snapshot=self.read_snapshot,
            policy=ConfigPolicy(lambda: self.config),
            processes=ProcessSampler(),
        )
        self.handlers.update(self.guard.handlers())

    def _guard_jobs(self) -> List[JobRecord]:
        """The job manager's jobs as the guard reads them: records (a manager that still gives
        dicts has them read into records here, the one place the guard gets its jobs)."""
        if self.jobs is None:
            return []
        return [
            JobRecord.from_json(d) if isinstance(d, dict) else d for d in self.jobs.guard_jobs()
        ]

    # -- running ------------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped. Returns 0; when another engine holds this state folder, says so
        and returns 0 at once."""
        self.paths.ensure()
        if not self.lock.acquire():
            pid = self.lock.holder_pid()
            log.info(
                "an engine is already running for %s%s",
                self.paths.home,
                f" (pid {pid})" if pid else "",
            )
            if self.metrics_flag or self.stay:
                # Not applied to the one running: said, or a user takes them for done.
                log.warning(
                    "--metrics and --stay start no exporter and keep nothing running "
                    "here: they apply to a new engine only. Set [metrics] listen in "
                    "config.toml (the running engine applies it within seconds), or "
                    "stop that engine and start this one again"
                )
            return 0
        try:
            for note in harden_process():
                log.info("%s", note)
            self._open_parts()
            self.config_watch.report_start()
            key = secrets.token_bytes(32)
            self.server = ChannelServer(
                self.paths.control_address,
                key,
                self._handle,
                name="control",
                idle_timeout=channel.IDLE_SECONDS,
            )
            self.server.start()
            self._parts.run("the metrics", self.metrics.start, self.started)
            # The key is written only after the socket exists, so a client that finds the key
            # finds an engine behind it.
            configmod.atomic_write_bytes(self.paths.key_file, key, mode=0o600)
            self._install_signals()
            assert self._gpu_backend is not None  # opened with the other parts
            self.emit_event(
                E.ENGINE_STARTED,
                f"engine started (pid {os.getpid()}, "
                f"GPU backend: {self._gpu_backend.status.backend})",
                data={"pid": os.getpid(), "version": __version__},
            )
            log.info("engine %s listening for %s", __version__, self.paths.home)
            self._loop()
            return 0
        finally:
            self._shutdown()

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop("signal"))
        if hasattr(signal, "SIGHUP"):
            signal.signal(signal.SIGHUP, lambda *_: self.stop("hang-up"))

    def stop(self, reason: str = "stopped") -> None:
        self._exit_reason = reason
        self._stop.set()
        self._wake.set()

    def wake(self) -> None:
        """Sample again now (after a job starts, a setting changes, ...)."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
                self._parts.worked("sampling")
            except Exception as e:  # the guard must outlive any one bad reading
                self._parts.failed("sampling", e)
            interval = self.next_interval()
            self._wake.wait(max(0.0, interval - (time.monotonic() - started)))
            self._wake.clear()
            if self._should_exit_idle():
                self._exit_reason = "idle"
                log.info(
                    "no clients and no jobs for %.0f s; exiting",
                    self.config["engine.idle_exit_seconds"],
                )
                break

    def next_interval(self) -> float:
        base = float(self.config["engine.sample_interval"])
        if self.guard is not None:
            return float(self.guard.next_interval(base))
        return base

    def _should_exit_idle(self) -> bool:
        # An engine serving metrics is watched by Prometheus even with no client or job here.
        if self.stay or self.metrics.serving():
            return False
        busy = (self.server is not None and self.server.client_count > 0) or (
            self.jobs is not None and self.jobs.active_count() > 0
        )
        now = time.monotonic()
        if busy:
            self._idle_since = now
            return False
        return now - self._idle_since >= float(self.config["engine.idle_exit_seconds"])

    def read_snapshot(self, gpus_now: bool = False) -> Snapshot:
        """A fresh reading: memory always, GPUs at most once a second unless ``gpus_now``."""
        probe, backend = self._memory_probe, self._gpu_backend
        assert probe is not None and backend is not None  # given, or opened with the parts
        now = self.clock()
        memory = probe.read()
        if gpus_now or now - self._gpu_read_at >= GPU_MIN_INTERVAL:
            self._gpus = tuple(backend.read())
            self._gpu_read_at = now
        return Snapshot(now, memory, self._gpus, backend.status)

    def tick(self) -> None:
        """One reading, then each part on its own (``Parts``): job bookkeeping, the guard,
        history, the store, the push to clients. A part that fails is logged and the others
        still run, the guard's ladder above all."""
        snap = self.read_snapshot(gpus_now=self.guard is not None and self.guard.wants_gpus())
        with self._state_lock:
            self.latest = snap
        parts = self._parts
        if self.jobs is not None:
            parts.run("job bookkeeping", self.jobs.tick, snap)
        if self.guard is not None:
            parts.run("the guard", self.guard.step, snap)
        # History keeps one sample a second; at the guard's fast rate the rest are not built.
        parts.run("the metrics", self._publish_metrics, snap)
        if self.recent.due(snap.time):
            parts.run("history", self._record_sample, snap)
        mono = time.monotonic()
        if mono - self._last_flush >= STORE_FLUSH_INTERVAL:
            self._last_flush = mono
            # A hand edit of config.toml: one stat a second.
            parts.run("the config file", self.config_watch.poll)
            parts.run("the store", self._flush_store)
        if self.server is not None and mono - self._last_publish >= 1.0 / float(
            self.config["engine.publish_hz"]
        ):
            self._last_publish = mono
            parts.run("the snapshot push", self._publish_snapshot)

    def _record_sample(self, snap: Snapshot) -> None:
        jobs = self.jobs.list(include_finished=False) if self.jobs is not None else []
        values = sample_values(snap, jobs)
        # Per-name series stay in memory: names come and go, the store keeps what lasts.
        named = process_values(
            snap.gpus, jobs, self.consumers.update(snap.time, pid_owners(jobs).keys())
        )
        self.recent.add(snap.time, {**values, **named})
        self._history_store().add_sample(snap.time, values)

    def _flush_store(self) -> None:
        self._history_store().flush()
        self._report_store_health()

    def _history_store(self) -> Store:
        if self.store is None:
            raise Unknown("the engine has no history store yet")
        return self.store

    def _publish_metrics(self, snap: Snapshot) -> None:
        if not self.metrics.serving():
            return
        guard = self.guard.state_json() if self.guard is not None else {}
        jobs = self.jobs.guard_jobs() if self.jobs is not None else []
        self.metrics.publish(snap, guard, jobs)

    def _publish_snapshot(self) -> None:
        # Built only for a subscriber: at rest, with no tray, the engine makes no status.
        if self.server is not None and self.server.subscribed("snapshot"):
            self.server.broadcast("snapshot", self.status())

    def _report_store_health(self) -> None:
        """One warning when history stops reaching the disk (full, read-only), one line when it
        works again; the guard carries on either way."""
        err = getattr(self.store, "write_error", None)
        if err == self._store_error:
            return
        if err and not self._store_error:
            self.emit_event(
                E.STORE_ERROR,
                f"history cannot be written ({err}); the guard keeps "
                "working and keeps recent history in memory",
                level="warn",
            )
        elif not err:
            self.emit_event(E.STORE_OK, "history is written to disk again")
        self._store_error = err

    def _shutdown(self) -> None:
        try:
            self.metrics.close()
            if self.server is not None:
                self.server.close()
            try:
                self.paths.key_file.unlink()
            except OSError:
                pass
            if self.guard is not None:
                self.guard.close()  # continues foreign processes a user rule suspended
            if self.jobs is not None:
                self.jobs.close()
            if self.store is not None:
                self.store.add_event(E.ENGINE_STOPPED, f"engine stopped ({self._exit_reason})")
                self.store.close()
            if self._gpu_backend is not None:
                self._gpu_backend.close()
        finally:
            self.lock.release()

    # -- events -------------------------------------------------------------------------------

    def emit_event(
        self,
        kind: str,
        message: str,
        *,
        level: str = "info",
        job_id: Optional[str] = None,
        data: Optional[JSONObject] = None,
    ) -> EngineEvent:
        """Record an event in the store and push it to subscribers; returns the event (its
        message escaped to one line: it often names a job, and every client shows it)."""
        message = one_line(str(message))
        event = None
        if self.store is not None:
            try:
                event = self.store.add_event(kind, message, level=level, job_id=job_id, data=data)
                self._parts.worked("the event store")
            except Exception as e:  # the event is still logged and pushed
                self._parts.failed("the event store", e)
        if event is None:
            event = EngineEvent(self.clock(), kind, level, message, job_id, data)
        self.metrics.note_event(kind, data)
        log.log(logging.WARNING if level in ("warn", "error") else logging.INFO, "%s", message)
        if self.server is not None:
            self.server.broadcast("event", event.to_json())
        return event

    # -- answers ------------------------------------------------------------------------------

    def status(self) -> JSONObject:
        """The status object of DESIGN.md (``headroom status --json``), plus an ``engine``
        part: ``status_record``'s JSON."""
        return self.status_record().to_json()

    def status_record(self) -> Status:
        """What the engine knows now, as the record its clients read back."""
        with self._state_lock:
            snap = self.latest
        if snap is None:
            snap = self.read_snapshot()
        if self.guard is not None:
            guard = self.guard.state_json()
        else:
            guard = {
                "state": GuardLevel.OK,
                "mode": self.config["guard.mode"],
                "reasons": [],
                "seconds_to_exhaustion": None,
            }
        return Status(
            snap.time,
            snap.memory,
            snap.gpus,
            snap.gpu_status,
            guard=GuardView.from_json(guard),
            jobs=tuple(self.jobs.list(include_finished=False)) if self.jobs is not None else (),
            consumers=tuple(self.consumers.latest),
            engine=EngineView(
                running=True,
                pid=os.getpid(),
                version=__version__,
                started=self.started,
                demo=self.demo,
                home=str(self.paths.home),
                sample_interval=self.next_interval(),
                rlimits=rlimits_json(),
                clients=self.server.client_count if self.server is not None else 0,
                store_error=getattr(self.store, "write_error", None),
                config_problems=tuple(shown_problems(self.config.problems)),
                metrics=self.metrics.state_json(),
                protection=self.jobs.protection() if self.jobs is not None else {},
            ),
            guard_json=guard,
        )

    def _handle(self, peer: Peer, data: bytes) -> Optional[JSONObject]:
        try:
            req_id, op, args = protocol.parse_request(data)
        except protocol.ProtocolError as e:
            return protocol.error(None, str(e), "bad_request")
        handler = self.handlers.get(op)
        if handler is None:
            return protocol.error(req_id, f"{op} is not available in this engine", "bad_request")
        try:
            return protocol.ok(req_id, handler(peer, Args(args)))
        except ConfigConflict as e:
            return protocol.error(req_id, str(e), "conflict")
        except Refused as e:  # ConfigError and SpecError are refusals too
            message = e.args[0] if e.args else str(e)
            return protocol.error(req_id, str(message), "refused")
        except Exception:  # a fault, not a refusal: said as one, with its traceback logged
            log.exception("%s failed", op)
            return protocol.error(req_id, "internal error in the engine (see its log)", "internal")

    def _op_ping(self, peer: Peer, args: Args) -> JSONObject:
        return {
            "version": __version__,
            "pid": os.getpid(),
            "home": str(self.paths.home),
            "demo": self.demo,
        }

    def _op_history(self, peer: Peer, args: Args) -> Dict[str, Any]:
        end = args.opt_number("end") or self.clock()
        start = args.number("start")
        if start > end:
            raise Refused("history: start is after end")
        series, prefix = args.opt_texts("series"), args.opt_texts("prefix")
        if self.recent.covers(start):
            return self.recent.query(start, end, series, prefix)
        answer = self._history_store().history(start, end, series=series, prefix=prefix)
        if answer.get("resolution") == "raw":
            # The per-name series since the engine started, which only memory has.
            recent = self.recent.query(start, end, series, prefix)["series"]
            answer["series"].update({n: c for n, c in recent.items() if memory_only(n)})
        return answer

    def _op_events(self, peer: Peer, args: Args) -> List[JSONObject]:
        limit = args.opt_int("limit") or 500
        if not 1 <= limit <= 5000:
            raise Refused("events: limit must be between 1 and 5000")
        found = self._history_store().events(
            since=args.opt_number("since"),
            after_id=args.opt_int("after_id"),
            job_id=args.opt_text("job"),
            limit=limit,
        )
        return [e.to_json() for e in found]

    def _op_subscribe(self, peer: Peer, args: Args) -> JSONObject:
        kinds = {
            k
            for k, default in (("snapshot", True), ("event", True), ("log", False))
            if args.flag(k + "s", default)
        }
        peer.subscribe(kinds)
        return {"subscribed": sorted(kinds), "status": self.status()}

    def _config_json(self) -> JSONObject:
        config = self.config
        return {
            "path": str(self.paths.config_file),
            "values": config.to_json(),
            "problems": list(config.problems),
            "version": config.version,
        }

    def _op_config_set(self, peer: Peer, args: Args) -> JSONObject:
        """Save one setting. With ``version`` (``config_get``'s), a file edited since is refused
        ("conflict") instead of written over."""
        name, value, version = args.text("name"), args.value("value"), args.opt_text("version")
        checked = self.config_watch.save(name, value, version)
        self.emit_event(
            E.CONFIG_CHANGED, f"setting {name} = {checked!r}", data={"name": name, "value": checked}
        )
        return self._config_json()

    def _op_guard_mode(self, peer: Peer, args: Args) -> JSONObject:
        return self._op_config_set(peer, Args({"name": "guard.mode", "value": args.text("mode")}))

    def reload_config(self) -> None:
        self.config_watch.reload(cause="save")

    def _op_shutdown(self, peer: Peer, args: Args) -> JSONObject:
        active = self.jobs.active_count() if self.jobs is not None else 0
        if active and not args.flag("force"):
            raise Refused(
                f"{active} job(s) still running; stop them first or shut down with "
                "force to stop them"
            )
        if active and self.jobs is not None:
            self.jobs.stop_all("the engine was shut down")
        self.stop("shutdown requested")
        return {"stopping": True}
