"""The tray application: ``run_tray(args, paths)`` and ``HeadroomApp.open_window(name)``.

Start-up order: the icon first (grey), then the engine in the background, so the icon shows at
once even while an engine starts. Everything from the engine arrives through ``EngineWorker``
and every request goes through ``CallRunner``: nothing here blocks the GUI thread.

Windows written elsewhere are imported lazily by name, so the tray runs without them:

- ``trayapp.ui.launch.LaunchDialog(client_factory, parent=None)``
- ``trayapp.ui.jobs_window.JobsWindow(client_factory, parent=None)``
- ``trayapp.ui.settings.SettingsDialog(client_factory, parent=None)``

``client_factory()`` returns a new ``EngineClient``; its calls block, so make them off the GUI
thread (``trayapp.ui.worker.CallRunner(client_factory)`` does that) and close the client when
done. The app calls these optional methods on the GUI thread when a window has them:
``apply_snapshot(status)``, ``add_event(event)``, ``set_config(config)``,
``set_reachable(reachable, reason)``. Until a module exists, its menu entry shows a short
"not available yet" message.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, cast

from PySide6.QtCore import QObject, QSettings, Qt, QTimer
from PySide6.QtWidgets import QApplication, QMessageBox, QSystemTrayIcon, QWidget

from trayapp import private
from trayapp.config import ConfigError, Paths
from trayapp.config.view import ConfigView
from trayapp.engine.client import EngineClient, EngineError
from trayapp.engine.event_record import EngineEvent
from trayapp.engine.status_record import Status
from trayapp.jobs.record import JobRecord
from trayapp.logformat import LogFormatter
from trayapp.private import UnsafePath
from trayapp.text import one_line
from trayapp.ui.data import load_range
from trayapp.ui.icon import make_icon
from trayapp.ui.model import IconState, active_jobs
from trayapp.ui.single_instance import WINDOWS, SingleInstance
from trayapp.ui.tray import TrayController
from trayapp.ui.worker import CallRunner, EngineWorker, collect_garbage_on_gui_thread
from trayapp.vocab import GuardLevel as L

log = logging.getLogger("headroom.ui")

# Windows other modules provide: name -> (module, class).
EXTERNAL_WINDOWS: Dict[str, tuple] = {
    "launch": ("trayapp.ui.launch", "LaunchDialog", "Launching training"),
    "jobs": ("trayapp.ui.jobs_window", "JobsWindow", "The jobs window"),
    "settings": ("trayapp.ui.settings", "SettingsDialog", "The settings dialog"),
    "machines": ("trayapp.ui.machines", "MachinesWindow", "The Machines window"),
}
# How long quitting waits for the engine to stop the jobs or shut down before leaving anyway.
QUIT_TIMEOUT_MS = 10_000
# An open dashboard redraws its plots at most this often (its words follow every status).
DASHBOARD_REDRAW_SECONDS = 2.0
QUIT_KEEP, QUIT_STOP, QUIT_CANCEL = "keep", "stop", "cancel"


def no_tray_reason() -> str:
    """Why there is no system tray here, in words for the user."""
    desktop = os.environ.get("XDG_CURRENT_DESKTOP", "")
    if "GNOME" in desktop.upper():
        return "GNOME shows tray icons only with the AppIndicator extension"
    if sys.platform.startswith("linux"):
        return "this desktop has no system tray"
    return "the system tray is not available"


class HeadroomApp(QObject):
    """The tray, the dashboard and the windows, fed by one ``EngineWorker``."""

    def __init__(
        self,
        paths: Paths,
        *,
        demo: bool = False,
        config_file: Optional[str] = None,
        tray_available: Optional[bool] = None,
        start_engine: bool = True,
        parent: Optional[QObject] = None,
    ):
        super().__init__(parent)
        self.paths = paths
        self.demo = demo
        if tray_available is None:
            tray_available = QSystemTrayIcon.isSystemTrayAvailable()
        self.tray_available = tray_available
        self.no_tray_reason = None if tray_available else no_tray_reason()
        self.settings = QSettings(str(paths.data_dir / "ui.ini"), QSettings.Format.IniFormat)
        self.status: Optional[Status] = None
        self.reachable = False
        self.reason: Optional[str] = "connecting to the engine"
        self.config: Optional[ConfigView] = None
        self.notifications = True
        self.recent_events: Deque[EngineEvent] = deque(maxlen=200)
        self.windows: Dict[str, QWidget] = {}
        self.messages: List[str] = []  # the last messages shown to the user (newest last)
        self.quit_prompt: Callable[[List[JobRecord]], str] = self._ask_quit
        self._dashboard: Any = None
        self._quitting = False
        self._finished = False
        self._config_seen = False  # ui.show_dashboard_at_start applies to the first one
        self.tray: Optional[TrayController] = TrayController(demo) if tray_available else None
        if self.tray is not None:
            self.tray.chosen.connect(self.choose)
            self.tray.toggled.connect(self.toggle_dashboard)
            self.tray.notice_clicked.connect(self.show_event)
        self.worker = EngineWorker(
            paths, start_engine=start_engine, demo=demo, config_file=config_file
        )
        self.worker.snapshot.connect(self._on_snapshot)
        self.worker.event_received.connect(self._on_event)
        self.worker.config.connect(self._on_config)
        self.worker.unreachable.connect(self._on_unreachable)
        self.calls = CallRunner(self.client_factory, parent=self)
        self.calls.failed.connect(self.tell)

    # -- life ------------------------------------------------------------------------------

    def client_factory(self) -> EngineClient:
        """A new client of this app's engine (blocking calls; close it when done)."""
        return EngineClient(self.paths)

    def start(self) -> None:
        """Show the icon (grey until the engine answers), then connect in the background."""
        if self.tray is not None:
            self.tray.show()
        else:
            self.open_window("dashboard")
        self.worker.start()

    def close(self) -> None:
        """Stop talking to the engine (it keeps running) and close the windows."""
        if self._finished:
            return
        self._finished = True
        if not self.worker.stop():
            log.warning("the engine poller did not stop in time")
        self.calls.close()
        if self._dashboard is not None:
            self._dashboard.save_state()
            self._dashboard.close_handler = None
        # Closed and deleted by Qt on the GUI thread, children before parents, rather than left
        # to Python's cycle collector, which may clear a plot item's attributes while Qt still
        # calls into it.
        for w in [self._dashboard, *self.windows.values()]:
            if w is not None:
                w.close()
                w.deleteLater()
        self._dashboard = None
        self.windows.clear()
        if self.tray is not None:
            self.tray.hide()
        self.settings.sync()

    # -- windows ---------------------------------------------------------------------------

    def dashboard(self) -> Any:
        """The dashboard, created on first use (pyqtgraph loads only then)."""
        if self._dashboard is None:
            from trayapp.ui.dashboard import Dashboard  # pyqtgraph and numpy load only now

            d = Dashboard(self.settings, no_tray_reason=self.no_tray_reason, demo=self.demo)
            d.live_redraw_seconds = DASHBOARD_REDRAW_SECONDS
            d.setWindowIcon(make_icon(IconState(L.OK, 10, 5)))
            d.historyRequested.connect(self._fetch_history)
            if self.tray is None:
                d.close_handler = self.request_quit
            if self.config is not None:
                d.set_config(self.config)
            if self.status is not None:
                d.apply_snapshot(self.status)
            d.set_reachable(self.reachable, self.reason)
            self._dashboard = d
        return self._dashboard

    def open_window(self, name: str) -> Optional[QWidget]:
        """Open "dashboard", "launch", "jobs" or "settings" (or bring it forward). Returns the
        window, or None when that window is not available yet (the user is told so)."""
        if name == "dashboard":
            return self._raise(self.dashboard())
        if name not in EXTERNAL_WINDOWS:
            self.tell(f"there is no window called {name!r}")
            return None
        window = self.windows.get(name)
        if window is not None:
            return self._raise(window)
        module_name, class_name, what = EXTERNAL_WINDOWS[name]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            self.tell(
                f"{what} is not available yet in this version of Headroom.",
                title="Not available yet",
                level="info",
            )
            return None
        window = getattr(module, class_name)(self.client_factory, None)
        self.windows[name] = window
        for hook, value in (("set_config", self.config), ("apply_snapshot", self.status)):
            if value is not None and hasattr(window, hook):
                getattr(window, hook)(value)
        if hasattr(window, "set_reachable"):
            window.set_reachable(self.reachable, self.reason)
        window.destroyed.connect(lambda *_: self.windows.pop(name, None))
        if hasattr(window, "launched"):
            window.launched.connect(self._show_launched_job)
        return self._raise(window)

    def _show_launched_job(self, job: JobRecord) -> None:
        """A job just launched from the dialog (its record): show it in the jobs window."""
        jobs = self.open_window("jobs")
        if jobs is not None and hasattr(jobs, "select_job"):
            jobs.select_job(job.id)

    @staticmethod
    def _raise(window: QWidget) -> QWidget:
        window.show()
        window.raise_()
        window.activateWindow()
        return window

    def toggle_dashboard(self) -> None:
        if self._dashboard is not None and self._dashboard.isVisible():
            self._dashboard.hide()
        else:
            self.open_window("dashboard")

    def show_event(self, event: Optional[EngineEvent]) -> None:
        """Open the dashboard at an event (a clicked notification)."""
        d = self.open_window("dashboard")
        if event is not None and d is not None:
            self._dashboard.show_event(event)

    def tell(self, text: str, title: str = "Headroom", level: str = "warn") -> None:
        """A message for the user: a notification, or a box when there is no tray."""
        self.messages = (self.messages + [text])[-20:]
        log.info("%s", text)
        if self.tray is not None:
            self.tray.message(title, text, level)
        else:
            box = QMessageBox(
                QMessageBox.Icon.Information if level == "info" else QMessageBox.Icon.Warning,
                title,
                one_line(text),
                QMessageBox.StandardButton.Ok,
                self._dashboard,
            )
            box.setTextFormat(Qt.TextFormat.PlainText)  # an engine's error may quote a job
            box.setModal(False)
            box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
            box.open()

    # -- the engine's side -----------------------------------------------------------------

    def _forward(self, hook: str, *args: Any) -> None:
        for w in list(self.windows.values()):
            method = getattr(w, hook, None)
            if method is not None:
                method(*args)

    def _on_snapshot(self, status: Status) -> None:
        came_back = not self.reachable
        self.status = status
        self.reachable = True
        self.reason = None
        if came_back:
            # Windows opened before the engine answered (``--open settings`` at a cold start)
            # or while it was away read what they need now.
            self._forward("set_reachable", True, None)
        if self.tray is not None:
            self.tray.update(status, True)
        if self._dashboard is not None:
            if not self._dashboard.reachable:
                self._dashboard.set_reachable(True)
            self._dashboard.apply_snapshot(status)
        self._forward("apply_snapshot", status)

    def _on_event(self, event: EngineEvent) -> None:
        self.recent_events.append(event)
        if self._dashboard is not None:
            self._dashboard.add_event(event)
        if self.tray is not None and self.notifications:
            self.tray.notify(event)
        self._forward("add_event", event)

    def _on_config(self, config: ConfigView) -> None:
        self.config = config
        ui = config.section("ui")
        self.notifications = bool(ui.get("notifications", True))
        if self._dashboard is not None:
            self._dashboard.set_config(config)
        self._forward("set_config", config)
        first, self._config_seen = not self._config_seen, True
        if first and ui.get("show_dashboard_at_start"):
            self.open_window("dashboard")

    def _on_unreachable(self, reason: str) -> None:
        self.reachable = False
        self.reason = reason
        if self.tray is not None:
            self.tray.update(None, False, reason)
        if self._dashboard is not None:
            self._dashboard.set_reachable(False, reason)
        self._forward("set_reachable", False, reason)

    def _fetch_history(self, seconds: float, gpus: List[int]) -> None:
        d = self._dashboard
        now = (self.status.time or None) if self.status is not None else None

        def failed(message: str) -> None:
            log.info("could not load the history: %s", message)
            d.history_failed()

        self.calls.submit(
            lambda c: load_range(c, seconds, gpus, now or time.time()),
            on_done=d.load_history,
            on_error=failed,
        )

    # -- the menu's actions ----------------------------------------------------------------

    def choose(self, key: str) -> None:
        """Do what a menu entry names (``model.menu_entries`` keys)."""
        if key.startswith("open:"):
            self.open_window(key[len("open:") :])
        elif key.startswith("job:"):
            job, _, action = key[len("job:") :].rpartition(":")
            self.calls.submit(lambda c: c.job_action(job, action))
        elif key == "pause_all":
            self.calls.submit(lambda c: c.pause_all())
        elif key.startswith("guard:"):
            mode = key[len("guard:") :]
            self.calls.submit(lambda c: c.guard_mode(mode), on_done=self._on_config)
        elif key == "quit":
            self.request_quit()

    # -- quitting --------------------------------------------------------------------------

    def _ask_quit(self, jobs: List[JobRecord]) -> str:
        names = ", ".join(j.name or j.id for j in jobs[:5])
        box = QMessageBox(
            QMessageBox.Icon.Question,
            "Quit Headroom",
            f"{len(jobs)} training job(s) still running: {names}.",
            QMessageBox.StandardButton.NoButton,
            self._dashboard,
        )
        box.setInformativeText(
            "Keep guarding them in the background: the engine stays and keeps watching them, "
            "and Headroom shows them again when you start it. Or stop them now."
        )
        keep = box.addButton("Keep guarding in the background", QMessageBox.ButtonRole.AcceptRole)
        stop = box.addButton("Stop the jobs", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(keep)
        box.exec()
        clicked = box.clickedButton()
        return QUIT_KEEP if clicked is keep else QUIT_STOP if clicked is stop else QUIT_CANCEL

    def request_quit(self) -> bool:
        """Quit the tray. With jobs running, ask: keep guarding them (the engine stays) or
        stop them. With none, stop the engine if this tray started it. Returns False when the
        user cancelled."""
        if self._quitting:
            return True
        jobs = active_jobs(self.status) if self.reachable else []
        started = self.worker.started_engine
        if jobs:
            choice = self.quit_prompt(jobs)
            if choice == QUIT_CANCEL:
                return False
            if choice == QUIT_STOP:
                ids = [j.id for j in jobs]

                def stop_jobs(c: EngineClient) -> None:
                    if started:
                        c.shutdown(force=True)
                        return
                    for jid in ids:
                        try:
                            c.job_action(jid, "stop", reason="stopped when Headroom quit")
                        except EngineError as e:
                            log.warning("could not stop job %s: %s", jid, e)

                self._leave_after(stop_jobs)
                return True
            self._finish()
            return True
        if started and self.reachable:
            self._leave_after(lambda c: c.shutdown(force=False))
            return True
        self._finish()
        return True

    def _leave_after(self, call: Callable[[EngineClient], Any]) -> None:
        self._quitting = True
        self.worker.halt()  # the engine may go away now: do not start a new one

        def failed(message: str) -> None:
            log.warning("quitting: %s", message)
            self._finish()

        self.calls.submit(call, on_done=lambda _: self._finish(), on_error=failed)
        QTimer.singleShot(QUIT_TIMEOUT_MS, self._finish)

    def _finish(self) -> None:
        if self._finished:
            return
        self._quitting = True
        self.close()
        app = QApplication.instance()
        if app is not None:
            app.quit()


def setup_logging(paths: Paths) -> None:
    """The tray's log: everything to ``tray.log`` in the state folder, warnings to stderr."""
    logger = logging.getLogger("headroom.ui")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    for h in list(logger.handlers):
        logger.removeHandler(h)
    # Escaped: a job's name or note in a message cannot break the line or reach a terminal.
    fmt = LogFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        fh = private.rotating_log_handler(
            paths.data_dir / "tray.log", max_bytes=1_000_000, backups=2
        )  # no link followed, 0600
        fh.setFormatter(fmt)
        logger.addHandler(fh)
    except (OSError, UnsafePath) as e:
        print(
            f"headroom: cannot write the log file {paths.data_dir / 'tray.log'} ({one_line(e)})",
            file=sys.stderr,
        )
    sh = logging.StreamHandler(sys.stderr)
    sh.setLevel(logging.WARNING)
    sh.setFormatter(fmt)
    logger.addHandler(sh)


def run_tray(args: Any, paths: Paths) -> int:
    """Run the tray until the user quits; returns the exit status. A second instance for the
    same state folder asks the first to open its window (``--open`` or the dashboard) and
    returns 0."""
    window = getattr(args, "open", None) or "dashboard"
    if window not in WINDOWS:
        print(f"headroom: --open takes one of {', '.join(WINDOWS)}", file=sys.stderr)
        return 2
    try:
        paths.ensure()
    except (OSError, ConfigError, UnsafePath) as e:
        print(
            f"headroom: cannot use the state folder {one_line(str(paths.home))}: {one_line(e)}",
            file=sys.stderr,
        )
        return 1
    setup_logging(paths)
    app = cast(QApplication, QApplication.instance() or QApplication(sys.argv[:1]))
    app.setApplicationName("headroom")
    app.setApplicationDisplayName("Headroom")
    app.setDesktopFileName("headroom")
    collect_garbage_on_gui_thread(app)
    single = SingleInstance(paths)
    try:
        primary = single.acquire()
    except OSError as e:
        print(f"headroom: {one_line(e)}", file=sys.stderr)
        return 1
    if not primary:
        if single.forward(window):
            print(f"Headroom is already running; opened the {window}", flush=True)
            return 0
        print(
            "headroom: another Headroom is running for this state folder but does not answer",
            file=sys.stderr,
        )
        return 1
    tray = HeadroomApp(
        paths, demo=bool(getattr(args, "demo", False)), config_file=getattr(args, "config", None)
    )
    # Python runs signal handlers only when it gets control: a slow timer gives it that.
    ticker = QTimer()
    ticker.timeout.connect(lambda: None)
    previous = {
        s: signal.signal(s, lambda *_: QTimer.singleShot(0, tray._finish))
        for s in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        app.setQuitOnLastWindowClosed(not tray.tray_available)
        single.activated.connect(tray.open_window)
        tray.start()
        if getattr(args, "open", None):
            tray.open_window(args.open)
        ticker.start(500)
        return int(app.exec())
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        ticker.stop()
        tray.close()
        single.close()
