"""The engine's side of ``config.toml``: a hand edit is noticed on the slow tick (one stat),
loaded, reported once and pushed to the clients; a save through the control channel never
writes over an edit it has not seen.

A file that cannot be read at all (a half-written edit, a syntax error) leaves the settings in
use as they were; a bad value gets that key's default, as at start, with a message naming it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any, List, Optional, Protocol

from trayapp import config as configmod
from trayapp.config import Config, Paths
from trayapp.jsonvalue import JSONObject
from trayapp.vocab import EventKind as E

log = logging.getLogger("headroom.engine")

PROBLEMS_SHOWN = 3  # problems spelled out in one event; the rest are counted
STATUS_PROBLEMS = 10  # in every status push; config_get has them all


def shown_problems(problems: List[str]) -> List[str]:
    """The problems for the status: the first few, then how many more."""
    if len(problems) <= STATUS_PROBLEMS:
        return list(problems)
    more = len(problems) - STATUS_PROBLEMS + 1
    return list(problems[: STATUS_PROBLEMS - 1]) + [
        f"config: and {more} more problems (see the settings)"
    ]


class ConfigHost(Protocol):
    """What the watcher needs of the engine: its settings (read and replaced), its paths,
    where events go, and a way to sample again now."""

    config: Config
    paths: Paths

    def emit_event(
        self,
        kind: str,
        message: str,
        *,
        level: str = ...,
        job_id: Optional[str] = ...,
        data: Optional[JSONObject] = ...,
    ) -> Any: ...

    def wake(self) -> None: ...


class ConfigWatcher:
    """Holds the engine's settings file in view. ``engine`` gives ``config`` (read and set),
    ``paths``, ``emit_event`` and ``wake``. Thread-safe: the tick and the control channel's
    threads both call it."""

    def __init__(self, engine: ConfigHost):
        self.engine = engine
        self.lock = threading.RLock()
        self._failed = False  # a failed look at the file is logged once, not every tick

    # -- what the engine calls ------------------------------------------------------------------

    def report_start(self) -> None:
        """The problems of the settings the engine started with: a log line and an event."""
        self._report_problems(self.engine.config.problems, at_start=True)

    def poll(self) -> bool:
        """On the slow tick: reload when the file changed since it was read. Returns whether it
        reloaded. Never raises: the guard's tick must not depend on it."""
        try:
            with self.lock:
                if not configmod.changed_since(self.engine.config):
                    self._failed = False
                    return False
                self.reload(cause="file")
                return True
        except Exception:
            if not self._failed:
                log.exception("could not look at the settings file; trying again")
            self._failed = True
            return False

    def reload(self, cause: str = "file") -> Config:
        """Load the file now, keep it as the engine's settings (see the module's note on a file
        that cannot be read), report what changed and any new problems once. Returns it."""
        with self.lock:
            old = self.engine.config
            new = configmod.load(self.engine.paths.config_file)
            if new.read_error is not None:
                new = dataclasses.replace(
                    old,
                    stamp=new.stamp,
                    version=new.version,
                    read_error=new.read_error,
                    problems=[
                        f"config: {new.path} cannot be read ({new.read_error}); the "
                        "settings in use stay as they were"
                    ],
                )
            self.engine.config = new
        changed = [
            s.name for s in configmod.SETTINGS if old.values.get(s.name) != new.values.get(s.name)
        ]
        if old.rules != new.rules:
            changed.append("guard.rules")
        if cause == "file":
            shown = ", ".join(
                f"{n} = {new.values[n]!r}" if n in new.values else n
                for n in changed[:PROBLEMS_SHOWN]
            )
            more = (
                f" and {len(changed) - PROBLEMS_SHOWN} more"
                if len(changed) > PROBLEMS_SHOWN
                else ""
            )
            self.engine.emit_event(
                E.CONFIG_CHANGED,
                f"{new.path} changed: " + (f"{shown}{more}" if changed else "no setting changed"),
                data={"names": changed, "source": "file"},
            )
        if new.problems != old.problems:
            self._report_problems(new.problems)
        self.engine.wake()
        return new

    def save(self, name: str, value: Any, version: Optional[str]) -> Any:
        """``config_set``: an edit not yet seen is loaded (and reported) first; with
        ``version`` (``config_get``'s), a file changed since then is refused with
        ConfigConflict. Returns the value saved."""
        with self.lock:
            if configmod.changed_since(self.engine.config):
                self.reload(cause="file")
            checked = configmod.save_value(
                self.engine.paths.config_file, name, value, version=version
            )
            self.reload(cause="save")
        return checked

    # -- reporting ------------------------------------------------------------------------------

    def _report_problems(self, problems: List[str], at_start: bool = False) -> None:
        if not problems:
            return
        head = "; ".join(problems[:PROBLEMS_SHOWN])
        more = len(problems) - PROBLEMS_SHOWN
        message = head + (f" (and {more} more; see the settings)" if more > 0 else "")
        data: JSONObject = {"problems": list(problems), "at_start": at_start}
        # The event logs its own line; the problems it leaves out get a line each.
        self.engine.emit_event(E.CONFIG_PROBLEM, message, level="warn", data=data)
        for p in problems[PROBLEMS_SHOWN:]:
            log.warning("%s", p)
