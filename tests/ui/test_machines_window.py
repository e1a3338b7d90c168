"""The Machines window, offscreen, against recorded answers of a real Prometheus served over a
real socket, and against no server, a closed port, an empty and a malformed answer."""

from __future__ import annotations

from typing import Any

import pytest

from tests.prometheus_answers import AnswerServer, closed_port, fleet_answers, recorded
from trayapp.config.view import ConfigView
from trayapp.ui.machines import MIN_COLUMN_WIDTH, MachinesWindow
from trayapp.ui.machines_text import NO_URL

pytestmark = pytest.mark.qt_log_ignore(
    r"This plugin does not support (propagateSizeHints|raise)\(\)",
    r"No such signal QPlatformNativeInterface::systemTrayWindowChanged")


def config(url: str, refresh: float = 1.0) -> ConfigView:
    return ConfigView(values={"machines": {"prometheus": url, "refresh_seconds": refresh}})


def open_window(qtbot: Any, url: str, refresh: float = 1.0) -> MachinesWindow:
    w = MachinesWindow(None)
    qtbot.addWidget(w)
    w.set_config(config(url, refresh))
    w.show()
    return w


def test_it_shows_each_machine_with_its_gpus_and_jobs_and_asks_again(qtbot: Any) -> None:
    with AnswerServer(fleet_answers()) as server:  # type: ignore[arg-type]
        w = open_window(qtbot, server.url)
        qtbot.waitUntil(lambda: w.answers >= 1, timeout=10000)
        assert w.status_label.text().startswith(
            f"3 machines, 1 not answering, from Prometheus at {server.url} at ")
        rows = w.rows()
        machines = [r for r in rows if not r[0].startswith("  ")]
        assert len(machines) == 3
        assert sum(1 for r in machines if r[3] == "not answering") == 1
        gpus = [r for r in rows if r[0].startswith("  GPU ")]
        assert [r[0] for r in gpus] == ["  GPU 0: Simulated RTX 4070 (demo)",
                                        "  GPU 1: Simulated RTX A4000 (demo)"]
        job = next(r for r in rows if "mnist-small" in r[0])
        assert job[3] == "running" and job[4].endswith("% done") and job[1].endswith("MiB")
        # Refreshed every refresh_seconds, with nothing done by the user.
        qtbot.waitUntil(lambda: w.answers >= 3, timeout=10000)
        # The server goes away: the last table stays, the line says why it is not new.
        server.answers = {}
        qtbot.waitUntil(lambda: w.error is not None, timeout=10000)
        assert "not JSON" in w.status_label.text() and "Trying again every 1 s" in \
            w.status_label.text()
        assert len(w.rows()) == len(rows)


def test_no_url_says_where_to_set_one(qtbot: Any) -> None:
    w = open_window(qtbot, "")
    assert w.status_label.text() == NO_URL
    assert w.rows() == [] and w.answers == 0


def test_before_the_settings_arrive_it_says_so(qtbot: Any) -> None:
    w = MachinesWindow(None)
    qtbot.addWidget(w)
    w.show()
    assert "Reading the settings" in w.status_label.text()
    w.set_reachable(False, "connection refused")
    assert w.status_label.text().startswith("The engine is not reachable (connection refused)")


def test_an_unreachable_server_gives_one_line(qtbot: Any) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    w = open_window(qtbot, url)
    qtbot.waitUntil(lambda: w.answers >= 1, timeout=10000)
    text = w.status_label.text()
    assert text.startswith(f"Prometheus at {url}: cannot reach it: ")
    assert "refused" in text.lower() and "\n" not in text
    assert w.rows() == []
    # An empty table keeps columns of a readable width, not squeezed to their titles.
    header = w.tree.header()
    assert all(header.sectionSize(c) >= MIN_COLUMN_WIDTH for c in range(header.count()))


def test_an_empty_or_malformed_answer_gives_one_line(qtbot: Any) -> None:
    with AnswerServer(fleet_answers(recorded("empty"))) as server:  # type: ignore[arg-type]
        w = open_window(qtbot, server.url)
        qtbot.waitUntil(lambda: w.answers >= 1, timeout=10000)
        assert "answers, but it has no machine running Headroom" in w.status_label.text()
        server.answers = {None: (200, "application/json", b'{"status": "success"}')}
        qtbot.waitUntil(lambda: w.error is not None, timeout=10000)
        assert "not an instant vector" in w.status_label.text()


def test_the_app_opens_it_and_hands_it_the_settings(qtbot: Any, app_on: Any) -> None:
    app = app_on()
    with AnswerServer(fleet_answers()) as server:  # type: ignore[arg-type]
        app._on_config(config(server.url, 2))
        w = app.open_window("machines")
        assert isinstance(w, MachinesWindow)
        assert w.url == server.url and w.refresh_seconds == 2
        qtbot.waitUntil(lambda: w.answers >= 1, timeout=10000)
        assert len([r for r in w.rows() if not r[0].startswith("  ")]) == 3
        # A changed URL in the settings: asked at once.
        app._on_config(config(""))
        assert w.status_label.text() == NO_URL and w.rows() == []
