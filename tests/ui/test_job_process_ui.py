"""The jobs window's details say how a job's process runs: its CPU priority, its OOM score and
its log's cap, as the engine launched it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.ui.test_jobs_window import EXIT_WITH, job_state, open_window, start_job
from trayapp.jobs.record_parts import ProcessSettings
from trayapp.ui.job_rows import process_rows
from trayapp.vocab import JobState as S

pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")


def test_process_rows_in_words() -> None:
    rows = dict(process_rows(ProcessSettings(nice=0, oom_score_adj=500, log_max_bytes=32 << 20)))
    assert rows["CPU priority"] == "nice 0 (the desktop's normal priority)"
    if sys.platform != "win32":
        assert rows["OOM score"].startswith("oom_score_adj +500 ")
    assert rows["Log"].startswith("capped at 32.0 MiB")
    assert process_rows(None) == []
    below = dict(process_rows(ProcessSettings(nice=12)))
    assert below["CPU priority"] == "nice 12 (below the desktop)"
    assert "OOM score" not in below  # not recorded: not said


def test_the_details_show_the_jobs_priority(qtbot, paths, start_engine) -> None:  # type: ignore
    Path(paths.config_file).write_text("[jobs]\nnice = 4\noom_score_adj = 700\n")
    engine = start_engine()
    done = start_job(engine, EXIT_WITH, "0", name="quick")
    qtbot.waitUntil(lambda: job_state(engine, done.id) == S.FINISHED, timeout=30000)
    window = open_window(qtbot, paths)
    qtbot.waitUntil(lambda: window.selected_id == done.id, timeout=10000)
    tree = window.options_tree

    def process_section() -> dict:
        for i in range(tree.topLevelItemCount()):
            top = tree.topLevelItem(i)
            if top.text(0) == "Process":
                return {top.child(j).text(0): top.child(j).text(1)
                        for j in range(top.childCount())}
        return {}

    qtbot.waitUntil(lambda: bool(process_section()), timeout=10000)
    rows = process_section()
    assert rows["CPU priority"] == "nice 4 (below the desktop)"
    if sys.platform != "win32":
        assert rows["OOM score"].startswith("oom_score_adj +700 ")
