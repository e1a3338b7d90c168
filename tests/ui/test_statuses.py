"""The UI's test statuses come from a real engine's answer: a field it renames fails here."""

from __future__ import annotations

import dataclasses

import pytest

from tests.ui.statuses import job, make_status, pin, recorded_status, status_json
from trayapp.engine.status_record import Status
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
        pin(status_json(), {"memory": {"free_bytes": 1}})


def test_the_tray_reads_the_recorded_jobs() -> None:
    status = make_status(jobs=[job("a1", "mnist"), job("b2", "gan", S.FINISHED)])
    assert [j.id for j in active_jobs(status)] == ["a1"]
    assert job_names(status) == {"a1": "mnist", "b2": "gan"}


def test_the_status_record_reads_all_that_the_engine_sends() -> None:
    sent = recorded_status()
    st = Status.from_json(sent)
    assert st.to_json() == sent  # nothing dropped, nothing renamed, nothing made up
    assert st.engine.running and st.engine.pid and st.memory is not None
    assert st.memory.total_bytes == sent["memory"]["total_bytes"]
    assert [g.index for g in st.gpus] == [g["index"] for g in sent["gpus"]]
    assert [j.id for j in st.jobs] == [j["id"] for j in sent["jobs"]]


@pytest.mark.parametrize("garbled", [
    None, [], "status", {"time": "soon"}, {"memory": {"total_bytes": "16G"}},
    {"gpus": [{"name": "no index"}, 3], "jobs": [{"no": "id"}], "guard": {"state": "panic"}},
    {"engine": "up", "guard": [], "consumers": [{"name": 1}], "gpu_status": 7},
])
def test_a_garbled_status_reads_as_not_known(garbled: object) -> None:
    st = Status.from_json(garbled)
    assert st.memory is None or st.memory.total_bytes is None
    assert st.gpus == () and st.jobs == () and st.consumers == ()
    assert st.guard.state in ("ok", None) and st.gpu_status.backend == "none"
    assert st.ram_fraction is None and st.vram_fraction is None
