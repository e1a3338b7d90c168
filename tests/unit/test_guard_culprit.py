"""Who a memory warning names: each job as one whole (its tree, its growth over the rate window
from the guard's history), other processes by name, those filling memory first (fastest first,
then the larger), then the largest; the engine's own process by its size only."""

from __future__ import annotations

from typing import Optional

from tests.unit.test_guard import GiB, Guard, MiB, job, notes, pct
from trayapp.engine.guard import Decision, ProcessView
from trayapp.engine.guard.text import top_text


def proc(pid: int, name: str, rss: int, rate: Optional[float] = None,
         job_id: Optional[str] = None, own: bool = False) -> ProcessView:
    return ProcessView(pid, name, rss, rate, job_id, own=own)


def warning_of(g: Guard) -> str:
    (top,) = [r for r in g.last.reasons if r.startswith(("filling:", "largest:"))]
    return top


class Ticks(Guard):
    """A job that grows by ``rate`` a second, ticked at 4 Hz below the warning threshold."""

    last: Decision

    def run(self, seconds: float, job_rate: float, processes: list, start: float = 0.0,
            rss: int = 600 * MiB) -> str:
        t = start
        while t <= start + seconds:
            j = job("a1", rss=int(rss + job_rate * (t - start)), name="train",
                    pids=(500, 501))
            self.last = self.tick(t, pct(14), [j], processes=processes)
            t += 0.25
        return warning_of(self)


def test_a_job_filling_memory_is_named_first_with_its_rate_over_the_window() -> None:
    g = Ticks()
    ps = [
        # The job's own processes as the sample saw them: one without a growth yet.
        proc(500, "python", 300 * MiB, None, job_id="a1"),
        proc(501, "python", 300 * MiB, None, job_id="a1"),
        proc(10, "firefox", 3 * GiB),  # large, not growing
        # The engine grew a little while reading the job: never its culprit.
        proc(20, "python", 160 * MiB, 157 * MiB, own=True),
    ]
    line = g.run(4.0, 40 * MiB, ps)
    assert line.startswith("filling: job a1 (train) ")
    assert "(+40.0 MiB/s)" in line.split(";")[0]
    assert "largest: firefox 3.0 GiB, headroom engine 160.0 MiB" in line
    assert "python" not in line  # the job's processes count in the job, once
    assert "157" not in line


def test_without_growth_the_largest_are_named_and_a_job_counts_as_its_tree() -> None:
    g = Ticks()
    ps = [proc(500, "python", 1 * GiB, None, job_id="a1"), proc(10, "firefox", 3 * GiB),
          proc(11, "code", 500 * MiB)]
    line = g.run(3.0, 0.0, ps, rss=2 * GiB)
    assert line == "largest: firefox 3.0 GiB, job a1 (train) 2.0 GiB, code 500.0 MiB"


def test_a_burst_that_ended_is_no_growth_a_steady_fill_is() -> None:
    # A process's rate comes from the sampler (over the window); a job's from the fit of its
    # series, which must be significant: a job that stopped growing is listed by size.
    g = Ticks()
    ps = [proc(10, "firefox", 3 * GiB, 2 * MiB)]
    g.run(3.0, 50 * MiB, ps)
    line = g.run(4.0, 0.0, ps, start=3.25, rss=600 * MiB + 150 * MiB)
    assert line == "filling: firefox 3.0 GiB (+2.0 MiB/s); largest: job a1 (train) 750.0 MiB"


def test_the_text_ranks_growth_then_size() -> None:
    rows = [("a", 10 * MiB, 5 * MiB), ("b", 1 * GiB, 5 * MiB), ("c", 8 * GiB, None),
            ("d", 100 * MiB, 50 * MiB), ("e", 2 * GiB, None)]
    assert top_text(rows, 3) == "filling: d 100.0 MiB (+50.0 MiB/s), b 1.0 GiB (+5.0 MiB/s), " \
                                "a 10.0 MiB (+5.0 MiB/s)"
    assert top_text(rows, 5) == "filling: d 100.0 MiB (+50.0 MiB/s), b 1.0 GiB (+5.0 MiB/s), " \
                                "a 10.0 MiB (+5.0 MiB/s); largest: c 8.0 GiB, e 2.0 GiB"
    assert top_text([("c", 8 * GiB, None)]) == "largest: c 8.0 GiB"
    assert top_text([]) == ""


def test_only_a_warning_about_memory_names_anyone() -> None:
    g = Guard()
    d = g.tick(0.0, pct(50), [job("a1")], processes=[proc(10, "firefox", 3 * GiB)])
    assert d.state == "ok" and not any("largest" in r for r in d.reasons)
    d = g.tick(1.0, pct(14), [job("a1")], processes=[proc(10, "firefox", 3 * GiB)])
    (w,) = notes(d)
    assert "largest: firefox 3.0 GiB, job j1" not in w.message
    assert "largest: firefox 3.0 GiB, job a1 (a1.py) 1.0 GiB" in w.message
