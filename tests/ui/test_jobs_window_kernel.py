"""The jobs window on a Jupyter kernel's job: Park becomes "Interrupt fit", enabled only while
the kernel runs a fit(); the engine's refusal shows as one line; Stop asks about the kernel."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Iterator

import pytest
from PySide6.QtCore import Qt

from trayapp.engine.client import EngineClient
from trayapp.jobs.record import JobRecord, records
from trayapp.ui.job_rows import (
    COLUMNS,
    INTERRUPT_TEXT,
    action_refusal,
    action_words,
    cell_text,
    progress_text,
    stop_question,
)
from trayapp.ui.jobs_window import JobsWindow
from trayapp.vocab import GuardAct as A
from trayapp.vocab import JobState as S

pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")
# A process of the user that registers itself as a kernel (it runs no runner: no fit, ever).
SELF_ADOPT = ("import os, time\nfrom trayapp.config import get_paths\n"
              "from trayapp.engine.client import EngineClient\n"
              "print(EngineClient(get_paths()).request('kernel_adopt', pid=os.getpid(),"
              " name='train.ipynb')['job'], flush=True)\ntime.sleep(120)\n")


def test_a_kernels_park_is_the_interrupt_of_its_fit() -> None:
    idle = JobRecord(id="k1", name="train.ipynb", kind="kernel", state=S.RUNNING, hooked=True,
                     runner_state="idle", checkpoint_dir=None)
    text, tip = action_words(idle, A.PARK, "Park", "park tip")
    assert text == INTERRUPT_TEXT and "variables stay" in tip
    assert "no fit() " in (action_refusal(idle, A.PARK) or "")
    fitting = idle.with_(runner_state="running")
    assert action_refusal(fitting, A.PARK) is None  # no checkpoint folder needed to interrupt
    script = JobRecord(id="j1", name="mnist", state=S.RUNNING, hooked=True, checkpoint_dir="/c")
    assert action_words(script, A.PARK, "Park", "park tip") == ("Park", "park tip")
    assert "variables are lost" in stop_question(idle)


def test_a_kernel_between_fits_shows_its_last_fit_as_such() -> None:
    fitting = JobRecord(id="k1", name="train.ipynb", kind="kernel", state=S.RUNNING,
                        hooked=True, runner_state="running", epoch=172, epochs=400, step=1,
                        steps=256, eta_seconds=600.0)
    assert progress_text(fitting) == "epoch 172/400 · step 1/256"
    idle = fitting.with_(runner_state="idle")
    assert progress_text(idle) == "idle · last fit epoch 172/400"  # fits the Progress bar
    eta = COLUMNS.index("ETA")
    assert cell_text(idle, eta, 0.0) == "" and cell_text(fitting, eta, 0.0) == "10 min"
    assert progress_text(JobRecord(id="k2", name="n", kind="kernel", state=S.RUNNING)) == "idle"


@pytest.fixture
def self_made_kernel(home, start_engine) -> Iterator[str]:  # type: ignore[no-untyped-def]
    start_engine(demo=True)
    proc = subprocess.Popen([sys.executable, "-c", SELF_ADOPT, "--kernel"],
                            env={**os.environ, "HEADROOM_HOME": str(home)},
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout:
            proc.stdout.close()


def test_the_window_interrupts_only_a_fit_and_says_a_refusal_in_one_line(  # type: ignore
        qtbot, paths, self_made_kernel) -> None:
    window = JobsWindow(lambda: EngineClient(paths, timeout=10.0), poll_ms=200)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.loaded, timeout=15000)
    qtbot.waitUntil(lambda: window.select_job(self_made_kernel), timeout=10000)
    qtbot.waitUntil(lambda: window.selected_id == self_made_kernel, timeout=10000)
    window.hide()  # no more polls: the record below stays as pinned
    # Its "script" is Jupyter's connection file, and it has no log: both said in words.
    assert "Jupyter kernel" in window.header_label.text()
    assert "output is in its notebook" in window.log_view.placeholderText()
    button = window.buttons[A.PARK]
    assert button.text() == INTERRUPT_TEXT and button.accessibleName() == "Interrupt fit job"
    job = window.selected_job()
    assert job is not None

    def show(**fields: object) -> None:
        window.model.update_jobs(records([dict(job.to_json(), **fields)]), complete=False)
        window._selection_changed_data()

    show(state=S.RUNNING, hooked=True, runner_state="idle")
    assert not button.isEnabled() and "no fit to interrupt" in button.toolTip()
    # The window believes a fit runs; the engine knows better and refuses.
    show(state=S.RUNNING, hooked=True, runner_state="running")
    assert button.isEnabled() and "KeyboardInterrupt" in button.toolTip()
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: bool(window.action_error.text()), timeout=15000)
    said = window.action_error.text()
    assert "nothing to interrupt" in said and "\n" not in said, said
    assert window.buttons[A.STOP].text() == "Stop"
    assert not window.buttons["relaunch"].isEnabled()  # Jupyter starts kernels
