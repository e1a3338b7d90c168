"""The UI's test statuses come from a real engine's answer: a field it renames fails here."""

from __future__ import annotations

import dataclasses

import pytest

from tests.ui.statuses import job, make_status, pin, recorded_status
from trayapp.jobs.record import JobRecord
from trayapp.ui.model import active_jobs, job_names
from trayapp.vocab import JobState as S


def test_every_field_of_the_recorded_job_is_one_the_record_reads() -> None:
    sent = recorded_status()["jobs"][0]
    fields = {f.name for f in dataclasses.fields(JobRecord)}
    assert set(sent) - fields == set()
    record = JobRecord.from_json(sent)
    assert record.to_json() == {**record.to_json(), **{k: sent[k] for k in sent}}


def test_a_field_the_engine_does_not_send_cannot_be_pinned() -> None:
    with pytest.raises(KeyError, match="the engine's job record has no field 'park_by'"):
        job(park_by="guard")
    with pytest.raises(KeyError, match="the engine's status.memory has no field 'free_bytes'"):
        pin(make_status(), {"memory": {"free_bytes": 1}})


def test_the_tray_reads_the_recorded_jobs() -> None:
    status = make_status(jobs=[job("a1", "mnist"), job("b2", "gan", S.FINISHED)])
    assert [j.id for j in active_jobs(status)] == ["a1"]
    assert job_names(status) == {"a1": "mnist", "b2": "gan"}
