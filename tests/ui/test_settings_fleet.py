"""The settings window's Metrics and machines tab against a real engine: the exporter's address
and TLS files, and the Prometheus server the Machines window asks."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QLabel, QLineEdit

from tests.ui.test_settings import open_dialog
from trayapp import config as configmod

pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")

FLEET = ("metrics.listen", "metrics.tls_cert", "metrics.tls_key", "machines.prometheus",
         "machines.refresh_seconds")


def test_the_tab_holds_the_fleet_settings_and_saves_them(qtbot, paths,  # type: ignore[no-untyped-def]
                                                         start_engine) -> None:
    start_engine()
    dialog = open_dialog(qtbot, paths)
    titles = [dialog.tabs.tabText(i) for i in range(dialog.tabs.count())]
    page = dialog.tabs.widget(titles.index("Metrics and machines"))
    for name in FLEET:
        assert page.isAncestorOf(dialog.fields[name].widget), name
    listen = dialog.fields["metrics.listen"].widget
    assert isinstance(listen, QLineEdit) and "9835" in listen.placeholderText()
    assert dialog.fields["machines.refresh_seconds"].value() == 5
    # Under the fields, in words: who can read the metrics, and how long they are served.
    notes = [w.text() for w in page.findChildren(QLabel)
             if w.accessibleName() == "About the Metrics and machines settings"]
    assert len(notes) == 1 and "this machine only" in notes[0] and "keeps running" in notes[0]

    url = dialog.fields["machines.prometheus"]
    url.widget.setText("prometheus.lab:9090")
    assert "http://" in url.error.text() and not dialog.save_button.isEnabled()
    dialog.fields["metrics.listen"].widget.setText("99999")
    assert "port" in dialog.fields["metrics.listen"].error.text()

    url.widget.setText("http://127.0.0.1:9090")
    dialog.fields["metrics.listen"].widget.setText("")
    dialog.fields["machines.refresh_seconds"].widget.setValue(10)
    assert dialog.save_button.isEnabled()
    with qtbot.waitSignal(dialog.finished, timeout=15000):
        dialog.save()
    saved = configmod.load(paths.config_file)
    assert saved.problems == []
    assert saved["machines.prometheus"] == "http://127.0.0.1:9090"
    assert saved["machines.refresh_seconds"] == 10
    assert saved["metrics.listen"] == ""
