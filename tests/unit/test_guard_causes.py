"""The guard's table of causes: each cause's level, the setting of its threshold and its check
on a fresh reading, as the ladder, the choice of act and ``still_holds`` all read it."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import pytest

from trayapp import config, vocab
from trayapp.engine.guard import (
    CAUSES,
    MEMORY_LADDER,
    Action,
    CondKey,
    FillHistory,
    GuardInput,
    GuardState,
    JobView,
    Policy,
    Watch,
    assess,
    decide,
    still_holds,
)
from trayapp.readings import MemoryReading
from trayapp.vocab import GuardAct as A
from trayapp.vocab import GuardCause as C
from trayapp.vocab import GuardLevel as L

GiB = 1 << 30
TOTAL = 16 * GiB


def pct(p: float) -> int:
    return int(TOTAL * p / 100)


def reading(avail: int, t: float = 0.0) -> MemoryReading:
    return MemoryReading(time=t, total_bytes=TOTAL, available_bytes=avail,
                         used_bytes=TOTAL - avail, swap_total_bytes=0, swap_used_bytes=0,
                         psi_some_avg10=0.0, psi_full_avg10=0.0, limit_source="host")


def inp(avail: int, *jobs: JobView, t: float = 0.0) -> GuardInput:
    return GuardInput(t, reading(avail, t), jobs=tuple(jobs))


def test_every_cause_has_one_entry() -> None:
    assert set(CAUSES) == {c.value for c in C}


def test_the_table_names_real_guard_settings() -> None:
    guard_keys = {s.key for s in config.SETTINGS if s.section == "guard"}
    for cause, rule in CAUSES.items():
        assert rule.setting is None or rule.setting in guard_keys, cause
        assert rule.level in vocab.LEVELS and rule.act in {a.value for a in A}


def test_the_vocabulary_sets_agree_with_the_table() -> None:
    last = {c for c in MEMORY_LADDER if CAUSES[c].act in (A.PARK, A.STOP)}
    assert last == set(vocab.LAST_RESORT_CAUSES)
    budgets = {c for c, r in CAUSES.items() if r.act is A.PAUSE and r.setting is None}
    assert budgets == set(vocab.BUDGET_CAUSES)


def test_the_memory_ladder_goes_from_the_lowest_threshold_up() -> None:
    th = [getattr(Policy(), CAUSES[c].setting or "").bytes_of(TOTAL)
          for c in MEMORY_LADDER]
    assert th == sorted(th)
    ranks = [vocab.RANK[CAUSES[c].level] for c in MEMORY_LADDER]
    assert ranks == sorted(ranks, reverse=True)


@pytest.mark.parametrize("avail,cause,level", [
    (pct(1), C.MEM_STOP, L.PARK),
    (pct(4), C.MEM_PARK, L.PARK),
    (pct(7), C.MEM_PAUSE, L.PAUSE),
    (pct(14), C.MEM_WARN, L.WARN),
    (pct(50), None, None),
])
def test_the_ladder_names_the_first_threshold_crossed(avail: int, cause: Optional[str],
                                                       level: Optional[str]) -> None:
    a = assess(inp(avail), FillHistory(), Policy(), GuardState())
    mem = a.condition(CondKey(Watch.MEM))
    if cause is None:
        assert mem is None
    else:
        assert mem is not None and (mem.cause, mem.level) == (cause, level)
        assert CAUSES[mem.cause].level == mem.level


def _act(kind: str, cause: str, job_id: Optional[str] = "j1") -> Action:
    return Action(kind, "why", cause, job_id=job_id, key=f"{kind}:job:{job_id}")


RUNNING = JobView("j1", "a.py", "running", (11,), 2 * GiB, ram_budget_bytes=3 * GiB)
PAUSED = replace(RUNNING, state="paused", paused_by="guard")


@pytest.mark.parametrize("act,job,avail,holds", [
    (_act(A.PAUSE, C.MEM_PAUSE), RUNNING, pct(7), True),
    (_act(A.PAUSE, C.MEM_PAUSE), RUNNING, pct(9), False),
    (_act(A.PAUSE, C.MEM_STOP), RUNNING, pct(1), True),
    (_act(A.PAUSE, C.MEM_STOP), RUNNING, pct(3), False),
    (_act(A.PARK, C.MEM_PARK), PAUSED, pct(4), True),
    (_act(A.PARK, C.MEM_PARK), PAUSED, pct(6), False),
    (_act(A.PARK, C.MEM_FALLING), PAUSED, pct(7), True),
    (_act(A.PARK, C.MEM_FALLING), PAUSED, pct(9), False),
    (_act(A.PAUSE, C.MEM_PREDICTED), RUNNING, pct(7), True),  # short now: it still holds
    (_act(A.PAUSE, C.MEM_PREDICTED), RUNNING, pct(50), False),  # no fill seen any more
    (_act(A.PAUSE, C.BUDGET_RAM), replace(RUNNING, rss_bytes=3 * GiB), pct(50), True),
    (_act(A.PAUSE, C.BUDGET_RAM), RUNNING, pct(50), False),
    (_act(A.RESUME, C.CALM), PAUSED, pct(50), True),
    (_act(A.RESUME, C.CALM), PAUSED, pct(7), False),
    (_act(A.PAUSE, C.MEM_PAUSE), PAUSED, pct(7), False),  # it is paused already
    (_act(A.RESUME, C.CALM), RUNNING, pct(50), False),  # it runs already
])
def test_still_holds_reads_the_table(act: Action, job: JobView, avail: int,
                                     holds: bool) -> None:
    ok, why = still_holds(act, inp(avail, job), FillHistory(), Policy(), GuardState())
    assert ok is holds and (why == "") is holds


def test_a_budget_is_a_typed_key_and_a_raised_budget_follows_it() -> None:
    over = replace(RUNNING, rss_bytes=int(3.1 * GiB))
    a = assess(inp(pct(50), over), FillHistory(), Policy(), GuardState())
    (c,) = a.conditions
    assert c.key == CondKey(Watch.RAM, "j1") and c.cause == C.BUDGET_RAM
    assert c.level == CAUSES[C.BUDGET_RAM].level
    # Paused by the guard, then resumed by the user over the budget: the budget is raised.
    st = decide(inp(pct(50), replace(over, state="paused", paused_by="guard")), FillHistory(),
                Policy(), GuardState()).next
    st = decide(inp(pct(50), over, t=1.0), FillHistory(), Policy(), st).next
    assert set(st.grace) == {CondKey(Watch.RAM, "j1")}
    assert st.grace[CondKey(Watch.RAM, "j1")] > over.rss_bytes
    # Gone with the job.
    st = decide(inp(pct(50), t=2.0), FillHistory(), Policy(), st).next
    assert st.grace == {}
