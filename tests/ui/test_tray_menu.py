"""The tray's menu per engine state (rebuilt when it opens), its tooltip and notifications."""

from __future__ import annotations

from typing import Dict, List, Optional

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

from tests.ui.statuses import GiB, job, make_status
from trayapp.engine.event_record import EngineEvent
from trayapp.ui.model import banner_text, menu_entries, notice_for, tooltip_text, vram_split
from trayapp.ui.tray import TrayController
from trayapp.vocab import GuardLevel as L
from trayapp.vocab import JobState as S


def actions(menu: QMenu) -> Dict[str, QAction]:
    """Visible entries by text (separators left out)."""
    return {a.text(): a for a in menu.actions() if not a.isSeparator()}


def submenu(menu: QMenu, text: str) -> QMenu:
    action = actions(menu)[text]
    sub = action.menu()
    assert isinstance(sub, QMenu), text
    return sub


def open_menu(tray: TrayController) -> QMenu:
    # What Qt does right before it shows the menu.
    tray.menu.aboutToShow.emit()
    return tray.menu


def test_menu_without_an_engine(qtbot) -> None:
    tray = TrayController()
    menu = open_menu(tray)
    top = actions(menu)
    assert list(top) == ["Dashboard", "Launch training...", "Jobs", "Pause all jobs", "Guard",
                         "Machines...", "Settings...", "Quit"]
    assert top["Dashboard"].isEnabled() and top["Quit"].isEnabled()
    assert top["Machines..."].isEnabled()  # it asks Prometheus, not the engine
    for text in ("Launch training...", "Pause all jobs", "Settings..."):
        assert not top[text].isEnabled(), text
    assert not submenu(menu, "Guard").isEnabled()
    assert [a.text() for a in submenu(menu, "Jobs").actions()][0] == "Engine not reachable"


def test_menu_with_jobs_offers_what_each_state_allows(qtbot) -> None:
    tray = TrayController()
    tray.update(make_status(jobs=[job("a1", "mnist", S.RUNNING),
                                  job("b2", "resnet", S.PAUSED, epoch=0, epochs=None,
                                      step=None, steps=None)]), True)
    menu = open_menu(tray)
    top = actions(menu)
    assert top["Launch training..."].isEnabled() and top["Pause all jobs"].isEnabled()
    jobs = submenu(menu, "Jobs")
    texts = [a.text() for a in jobs.actions() if not a.isSeparator()]
    assert texts == ["mnist — running, epoch 2/10, step 120/500", "resnet — paused",
                     "All jobs..."]
    running = actions(submenu(jobs, texts[0]))
    paused = actions(submenu(jobs, texts[1]))
    assert [t for t, a in running.items() if a.isEnabled()] == ["Pause", "Park", "Stop"]
    assert [t for t, a in paused.items() if a.isEnabled()] == ["Resume", "Park", "Stop"]

    chosen: List[str] = []
    tray.chosen.connect(chosen.append)
    running["Pause"].trigger()
    paused["Resume"].trigger()
    top["Pause all jobs"].trigger()
    assert chosen == ["job:a1:pause", "job:b2:resume", "pause_all"]


def test_guard_modes_are_checkable_and_follow_the_engine(qtbot) -> None:
    tray = TrayController()
    for mode in ("act", "dry-run", "off"):
        tray.update(make_status(mode=mode), True)
        guard = submenu(open_menu(tray), "Guard")
        checked = [a.data() for a in guard.actions() if a.isChecked()]
        assert checked == [f"guard:{mode}"]
        assert all(a.isCheckable() for a in guard.actions())
    chosen: List[str] = []
    tray.chosen.connect(chosen.append)
    [a for a in guard.actions() if a.data() == "guard:act"][0].trigger()
    assert chosen == ["guard:act"]


def test_the_menu_is_rebuilt_each_time_it_opens(qtbot) -> None:
    tray = TrayController()
    tray.update(make_status(jobs=[]), True)
    jobs = submenu(open_menu(tray), "Jobs")
    assert [a.text() for a in jobs.actions()][0] == "No jobs running"
    tray.update(make_status(jobs=[job()]), True)
    assert [a.text() for a in submenu(open_menu(tray), "Jobs").actions()][0].startswith("mnist")
    tray.update(None, False, "the engine went away")
    assert not actions(open_menu(tray))["Launch training..."].isEnabled()
    # Old submenus do not pile up.
    qtbot.wait(10)
    assert len(tray.menu.findChildren(QMenu)) <= 4


def test_left_click_toggles_and_quit_is_chosen(qtbot) -> None:
    tray = TrayController()
    with qtbot.waitSignal(tray.toggled, timeout=1000):
        tray.icon.activated.emit(QSystemTrayIcon.ActivationReason.Trigger)
    with qtbot.waitSignal(tray.chosen, timeout=1000) as blocker:
        actions(open_menu(tray))["Quit"].trigger()
    assert blocker.args == ["quit"]


def test_tooltip_says_ram_vram_guard_and_jobs() -> None:
    st = make_status(L.WARN, available=1 * GiB, reasons=["available memory below 15%"], tte=95,
                     jobs=[job()])
    text = tooltip_text(st)
    lines = text.splitlines()
    assert lines[0] == "Headroom (simulated GPUs)"
    assert "RAM (left bar) 15.0 GiB used of 16.0 GiB, 1.0 GiB available" in text
    assert "GPU0 VRAM (right bar) 6.0 GiB of 12.0 GiB (50%)" in text
    assert "Guard: warn — available memory below 15%; memory runs out in ~1 min 35 s" in text
    assert "Jobs: mnist — running, epoch 2/10, step 120/500" in text
    gone = tooltip_text(st, reachable=False, reason="the engine went away")
    assert "Engine not reachable: the engine went away" in gone
    assert "Guard:" not in gone
    plain = tooltip_text(make_status(gpus=False))
    assert plain.splitlines()[0] == "Headroom"
    assert "VRAM n/a (no NVIDIA GPU found; the right bar is empty)" in plain
    assert "No jobs running" in plain


def test_menu_entries_disable_pause_all_without_pausable_jobs() -> None:
    entries = {e.key: e for e in menu_entries(make_status(jobs=[job(state=S.PAUSED)]), True)}
    assert not entries["pause_all"].enabled
    entries = {e.key: e for e in menu_entries(make_status(jobs=[job(state=S.FINISHED)]), True)}
    assert entries["jobs"].children[0].text == "No jobs running"


def test_a_kernels_park_is_interrupt_fit_and_only_during_a_fit() -> None:
    def park_entry(**fields: object) -> object:
        status = make_status(jobs=[job("k1", "mnist.ipynb", S.RUNNING, kind="kernel",
                                       hooked=True, **fields)])
        jobs = {e.key: e for e in menu_entries(status, True)}["jobs"]
        return {c.key: c for c in jobs.children[0].children}["job:k1:park"]

    in_fit = park_entry(runner_state="running")
    assert (in_fit.text, in_fit.enabled) == ("Interrupt fit", True)
    idle = park_entry(runner_state="idle")
    assert (idle.text, idle.enabled) == ("Interrupt fit", False)


def test_notifications_for_the_kinds_that_matter(qtbot) -> None:
    def ev(kind: str, level: Optional[str] = None) -> EngineEvent:
        return EngineEvent(1.0, kind, level or "", f"{kind} says", id=1)

    for kind in ("guard_warn", "guard_pause", "guard_park", "job_finished", "job_failed"):
        n = notice_for(ev(kind))
        assert n is not None and n.message == f"{kind} says"
    assert notice_for(ev("job_failed")).level == "error"  # type: ignore[union-attr]
    assert notice_for(ev("guard_warn")).level == "warn"  # type: ignore[union-attr]
    for kind in ("engine_started", "job_started", "config_changed", "guard_ok"):
        assert notice_for(ev(kind)) is None

    tray = TrayController()
    assert tray.notify(ev("guard_warn", "warn")) is True
    assert tray.notify(ev("job_started")) is False
    with qtbot.waitSignal(tray.notice_clicked, timeout=1000) as blocker:
        tray.icon.messageClicked.emit()
    assert blocker.args[0].kind == "guard_warn"


def test_banner_for_warnings_and_for_a_lost_engine() -> None:
    assert banner_text(make_status(), True) == ("", "")
    level, text = banner_text(make_status(L.PAUSE, reasons=["RAM 93% used"], tte=12), True)
    assert level == "pause" and text == "Jobs paused: RAM 93% used. Memory runs out in ~12 s"
    level, text = banner_text(make_status(L.WARN, mode="dry-run"), True)
    assert level == "warn" and "dry run" in text
    assert banner_text(make_status(mode="off"), True)[0] == "info"
    level, text = banner_text(None, False, "no engine is running")
    assert level == "unreachable" and "no engine is running" in text


def test_vram_is_split_into_jobs_and_other() -> None:
    split = vram_split(make_status(jobs=[job("a1")]))
    assert split == {0: {"job.a1": 4 * GiB, "other": 2 * GiB}}
    assert vram_split(make_status()) == {0: {"other": 6 * GiB}}
