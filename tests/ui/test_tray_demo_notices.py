"""In demo mode only the GPUs are simulated: a notification about RAM carries no "(simulated
GPUs)" (it would make a real warning look fake); one about VRAM does."""

from __future__ import annotations

from typing import List, Optional

import pytest

from trayapp.engine.event_record import EngineEvent
from trayapp.ui.tray import TrayController


def ev(cause: Optional[str]) -> EngineEvent:
    return EngineEvent(1.0, "guard_warn", "warn", "memory is short",
                       data={"cause": cause} if cause else None, id=1)


@pytest.mark.parametrize("demo,cause,simulated", [
    (True, "mem_warn", False), (True, "budget_ram", False), (True, None, False),
    (True, "gpu_vram", True), (True, "budget_vram", True), (True, "budget_vram_warn", True),
    (False, "gpu_vram", False),
])
def test_only_a_notice_about_the_gpus_says_they_are_simulated(
        qtbot, monkeypatch: pytest.MonkeyPatch, demo: bool, cause: Optional[str],
        simulated: bool) -> None:
    tray = TrayController(demo=demo)
    shown: List[str] = []
    monkeypatch.setattr(tray.icon, "showMessage", lambda title, *rest: shown.append(title))
    assert tray.notify(ev(cause)) is True
    (title,) = shown
    assert ("(simulated GPUs)" in title) is simulated, title
