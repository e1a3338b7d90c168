"""A job's record keeps its spec's --env as names only, however the record is made: launched,
read back from a row an older engine saved with the values, or built from JSON by a client."""

from __future__ import annotations

import json

from trayapp.jobs.options import JobSpec
from trayapp.jobs.record import JobRecord
from trayapp.jobs.stored_spec import StoredSpec

SECRET = "s3cr3t-value"


def test_a_record_never_holds_an_env_value() -> None:
    spec = JobSpec(script="/t/train.py", env=(("API_KEY", SECRET), ("MODE", "fast"))).to_json()
    assert SECRET in json.dumps(spec)  # the spec as launched has it
    for rec in (JobRecord(id="a", spec=spec),
                JobRecord.from_json({"id": "a", "spec": spec}),
                JobRecord(id="a").with_(spec=spec)):
        assert isinstance(rec.spec, StoredSpec)
        assert rec.spec["env"] == [["API_KEY", None], ["MODE", None]]
        assert rec.spec.env_names == ("API_KEY", "MODE")
        assert rec.spec["script"] == "/t/train.py"
        assert SECRET not in json.dumps(rec.to_json())


def test_env_in_another_shape_keeps_no_value() -> None:
    """A mapping keeps its names; a string or a number (garbled, or a value itself) is
    dropped whole."""
    assert StoredSpec({"env": {"TOKEN": SECRET}})["env"] == [["TOKEN", None]]
    assert StoredSpec({"env": f"TOKEN={SECRET}"})["env"] is None
    assert StoredSpec({"env": [["TOKEN", SECRET], "stray", ["a", "b", "c"]]})["env"] == [
        ["TOKEN", None]]
    assert StoredSpec({"script": "x.py"}).env_names == ()


def test_the_wire_form_is_the_specs_json() -> None:
    spec = JobSpec(script="/t/train.py", args=("3",), preset="desktop-safe").to_json()
    rec = JobRecord.from_json({"id": "a", "spec": spec})
    assert rec.to_json()["spec"] == spec  # no env: the JSON as it was
    assert rec.spec == spec and dict(rec.spec) == spec
    assert JobRecord.from_json(rec.to_json()) == rec
    # What is not an object reads as an empty spec.
    assert JobRecord.from_json({"id": "a", "spec": "train.py"}).spec == {}
