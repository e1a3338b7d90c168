"""Qt tests run on the offscreen platform, each on its own HEADROOM_HOME."""

from __future__ import annotations

import os

# Before anything imports Qt: no display is needed for these tests.
os.environ["QT_QPA_PLATFORM"] = "offscreen"

import gc  # noqa: E402
from typing import Any, Iterator, List  # noqa: E402

import pytest  # noqa: E402
from PySide6.QtCore import QCoreApplication, QEvent  # noqa: E402

from trayapp.config import Paths  # noqa: E402
from trayapp.ui.app import HeadroomApp  # noqa: E402
from trayapp.ui.worker import collect_garbage_on_gui_thread  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def heap_looked_at_once_a_module() -> Iterator[None]:
    """Each test below ends with a full collection, and then moves what is left alive out of
    the collector's sight (gc.freeze): the next test's collection looks at that test's own
    objects only, not again at the whole heap the run has built (most of a second a test, late
    in a run). At the end of the module the collector sees all of it again, on this thread."""
    yield
    gc.disable()
    gc.unfreeze()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    gc.collect()
    gc.enable()


@pytest.fixture(autouse=True)
def gc_on_gui_thread(qapp) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """As the tray does: Python's cycle collector runs on the GUI thread only, so a window left
    from an earlier test is never destroyed on a request thread."""
    timer = collect_garbage_on_gui_thread(qapp)
    yield
    timer.stop()
    # What the test deleted (deleteLater) goes now; the rest of its garbage is collected here,
    # on the GUI thread, so that a problem in it shows in this test and not a later one.
    # Collected before the collector is switched back on: a thread the test left running (a
    # launch dialog's interpreter probe) would otherwise start a collection of that garbage the
    # moment it is enabled, and destroy Qt objects off the GUI thread.
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    gc.collect()
    gc.freeze()
    gc.enable()


@pytest.fixture
def demo_engine(start_engine):  # type: ignore[no-untyped-def]
    """A real engine in --demo mode (simulated GPUs) on the test's HEADROOM_HOME."""
    return start_engine(demo=True)


@pytest.fixture
def app_on(qtbot, paths: Paths) -> Iterator:  # type: ignore[no-untyped-def]
    """A factory of HeadroomApps on the test's state folder (a tray unless told otherwise,
    no engine started by the app); every app is closed at the end."""
    made: List[HeadroomApp] = []

    def make(**kw: Any) -> HeadroomApp:
        kw.setdefault("tray_available", True)
        kw.setdefault("start_engine", False)
        app = HeadroomApp(paths, **kw)
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()
