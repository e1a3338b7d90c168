"""The jobs window's Options tab says what guards a job besides the guard."""

from __future__ import annotations

from trayapp.jobs.record import JobRecord
from trayapp.ui.job_rows import option_sections, options_key


def test_the_process_section_names_the_jobs_protection() -> None:
    braked = JobRecord(id="a1", protection="kernel brake (cgroup v1)")
    assert ("Memory", "kernel brake (cgroup v1)") in dict(option_sections(braked))["Process"]
    older = JobRecord(id="a1")
    assert "Process" not in dict(option_sections(older))
    assert options_key(braked) != options_key(older)  # the tab is filled again
