"""The launch dialog's background work (interpreter discovery and probes) never lets a thread hold
the last reference to a window: a window freed on a thread is destroyed off the GUI thread, which
crashes Qt (seen as a segmentation fault in a later test, while a probe outlived its dialog)."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import Any, List

from PySide6.QtCore import QCoreApplication, QEvent
from PySide6.QtWidgets import QWidget

from trayapp.ui.background import Background


class Window:
    """Stands for the dialog that ``on_done`` refers to."""


def _wait_for_threads(name: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while any(t.name == name for t in threading.enumerate()):
        assert time.monotonic() < deadline, f"{name} threads still running"
        time.sleep(0.01)


def test_a_window_closed_while_its_work_runs_is_freed_on_the_gui_thread(qtbot) -> None:  # type: ignore[no-untyped-def]
    owner = QWidget()
    background = Background(owner)
    gate = threading.Event()
    freed_on: List[str] = []
    window = Window()
    weakref.finalize(window, lambda: freed_on.append(threading.current_thread().name))
    background.submit(lambda: gate.wait(10), lambda result, w=window: None)
    del window
    # The dialog goes away while its probe still runs.
    background.close()
    owner.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    gc.collect()
    gate.set()
    _wait_for_threads("headroom-launch")
    gc.collect()
    assert freed_on == [threading.current_thread().name]  # not "headroom-launch"


def test_results_reach_on_done_on_the_gui_thread(qtbot) -> None:  # type: ignore[no-untyped-def]
    owner = QWidget()
    background = Background(owner)
    got: List[Any] = []

    def boom() -> Any:
        raise OSError("no such interpreter")

    background.submit(lambda: 42, lambda r: got.append((r, threading.current_thread().name)))
    background.submit(boom, lambda r: got.append((type(r), threading.current_thread().name)))
    qtbot.waitUntil(lambda: len(got) == 2, timeout=5000)
    main = threading.current_thread().name
    assert sorted(got, key=str) == sorted([(42, main), (OSError, main)], key=str)
    assert background.pending() == 0
    # Work that ends after close delivers nothing.
    gate = threading.Event()
    background.submit(lambda: gate.wait(10), lambda r: got.append(r))
    background.close()
    gate.set()
    _wait_for_threads("headroom-launch")
    QCoreApplication.processEvents()
    assert len(got) == 2
    owner.deleteLater()
