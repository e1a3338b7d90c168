"""``--fresh``: a run on a checkpoint folder that holds a checkpoint must say whether it continues
(``--resume``) or starts over (``--fresh``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from trayapp.cli import build_parser
from trayapp.jobs.options import JobSpec, SpecError, holds_checkpoint, spec_from_cli, validate


@pytest.fixture
def spec(tmp_path: Path) -> JobSpec:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    return JobSpec(script=str(script), checkpoint_dir=str(tmp_path / "ckpt"))


def test_a_checkpoint_in_the_folder_needs_resume_or_fresh(spec: JobSpec) -> None:
    folder = Path(str(spec.checkpoint_dir))
    validate(spec)  # no folder yet
    folder.mkdir()
    (folder / "fit-1").mkdir()
    validate(spec)  # an empty fit folder is no checkpoint
    assert not holds_checkpoint(str(folder))
    (folder / "fit-1" / "latest.weights.h5").write_bytes(b"weights")
    assert holds_checkpoint(str(folder))
    with pytest.raises(SpecError) as e:
        validate(spec)
    text = str(e.value)
    assert "\n" not in text and str(folder) in text and "--resume" in text and "--fresh" in text
    validate(replace(spec, resume=True))
    validate(replace(spec, fresh=True))
    validate(spec, check_paths=False)  # the files are checked where the job starts
    # Files of the user's own in the folder are not a checkpoint of Headroom's.
    (folder / "fit-1" / "latest.weights.h5").unlink()
    (folder / "model.keras").write_bytes(b"x")
    (folder / "fit-x").mkdir()
    (folder / "fit-x" / "training_metadata.json").write_text("{}")
    validate(spec)


@pytest.mark.parametrize("changes, words", [
    ({"fresh": True, "resume": True}, "--resume and --fresh cannot be combined"),
    ({"fresh": True, "checkpoint_dir": None}, "--fresh needs --checkpoint-dir"),
])
def test_fresh_with_what_it_cannot_go_with(spec: JobSpec, changes: dict, words: str) -> None:
    with pytest.raises(SpecError, match=words):
        validate(replace(spec, **changes))


def test_fresh_on_the_command_line_and_in_json(spec: JobSpec) -> None:
    ns = build_parser().parse_args(["run", "--fresh", "--checkpoint-dir", "ck", spec.script])
    parsed = spec_from_cli(ns)
    assert parsed.fresh and not parsed.resume
    assert JobSpec.from_json(parsed.to_json()) == parsed
    assert JobSpec.from_json({"script": "t.py"}).fresh is False
    with pytest.raises(SpecError, match="fresh must be true or false"):
        JobSpec.from_json({"script": "t.py", "fresh": "yes"})
