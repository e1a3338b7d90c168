"""The checkpoint manager's requests: a job's fit-<n> checkpoints listed with how far each got,
their size and time, and one deleted, only inside the job's own checkpoint folder. A hostile
request (another folder, "..", a link out, a file, a live job) deletes nothing. A real engine
and a real job for the requests; the folder functions on real files."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

from tests.conftest import REPO, EngineProcess, wait_for
from trayapp.engine import checkpoints as ck
from trayapp.engine.checkpoint_record import CheckpointListing
from trayapp.engine.client import EngineError
from trayapp.engine.protocol import ProtocolError, parse_request
from trayapp.jobs.options import JobSpec


def _fit(folder: Path, n: int, epoch: int, done: int, *, accumulation: int = 1,
         when: float = 1796050000.0) -> Path:
    sub = folder / f"fit-{n}"
    sub.mkdir(parents=True)
    (sub / "latest.weights.h5").write_bytes(b"w" * 1000)
    (sub / "training_metadata.json").write_text(json.dumps(
        {"epoch": epoch, "batch": max(done - 1, 0),
         "headroom": {"batches_done": done, "accumulation": accumulation, "finished": False,
                      "fit": n, "time": when}}))
    return sub


def test_a_listing_gives_each_fit_with_its_epoch_step_size_and_time(tmp_path: Path) -> None:
    _fit(tmp_path, 2, 3, 0, when=1796050100.0)
    _fit(tmp_path, 1, 14, 134, accumulation=2)
    (tmp_path / "fit-x").mkdir()  # not a checkpoint: left out
    (tmp_path / "fit-9").mkdir()  # a fit folder of nothing the runner writes: left out
    listing = ck.list_checkpoints(str(tmp_path))
    assert listing.exists is True
    first, second = listing.checkpoints
    assert (first.name, first.epoch, first.step, first.time) == \
        ("fit-1", 14, 67, 1796050000.0)  # 134 micro-batches of 2: 67 steps
    assert first.size_bytes == 1000 + (tmp_path / "fit-1" / ck.METADATA_FILE).stat().st_size
    assert (second.name, second.epoch, second.step) == ("fit-2", 3, 0)
    assert listing.later_than("fit-1") == ["fit-2"] and listing.later_than("fit-2") == []
    assert CheckpointListing.from_json(listing.to_json()) == listing  # as the client reads it
    assert ck.list_checkpoints(str(tmp_path / "gone")) == \
        CheckpointListing(None, str(tmp_path / "gone"), False, ())


def test_a_delete_removes_the_runners_files_and_keeps_the_users(tmp_path: Path) -> None:
    sub = _fit(tmp_path, 1, 2, 0)
    assert ck.delete_checkpoint(str(tmp_path), "fit-1") == {"deleted": "fit-1", "kept": []}
    assert not sub.exists()
    sub = _fit(tmp_path, 2, 2, 0)
    (sub / "notes.txt").write_text("mine")
    assert ck.delete_checkpoint(str(tmp_path), str(sub)) == \
        {"deleted": "fit-2", "kept": ["notes.txt"]}
    assert (sub / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("given", [
    "../victim", "fit-1/../../victim", "victim", "/etc", "fit-link", "fit-file", "fit-1/..",
    "fit-", "fit-1 ", "fit-99", "fit-１"])
def test_a_hostile_name_deletes_nothing(tmp_path: Path, given: str) -> None:
    folder, victim = tmp_path / "ckpt", tmp_path / "victim"
    _fit(folder, 1, 2, 0)
    victim.mkdir()
    for name in ck.RUNNER_FILES:
        (victim / name).write_text("precious")
    (folder / "fit-file").write_text("a file")
    if sys.platform != "win32":
        os.symlink(victim, folder / "fit-link")
    with pytest.raises(ValueError):
        ck.delete_checkpoint(str(folder), given)
    assert sorted(p.name for p in victim.iterdir()) == sorted(ck.RUNNER_FILES)
    assert (folder / "fit-1" / "latest.weights.h5").exists()
    assert (folder / "fit-file").read_text() == "a file"


def test_a_path_outside_the_folder_is_refused_even_when_it_is_a_fit(tmp_path: Path) -> None:
    other = _fit(tmp_path / "other", 1, 2, 0)
    _fit(tmp_path / "ckpt", 1, 2, 0)
    with pytest.raises(ValueError, match="not in the job's checkpoint folder"):
        ck.delete_checkpoint(str(tmp_path / "ckpt"), str(other))
    assert (other / "latest.weights.h5").exists()


def test_the_requests_are_checked_like_the_others() -> None:
    ok = {"id": 1, "op": "job_checkpoint_delete", "args": {"job": "a", "checkpoint": "fit-1"}}
    assert parse_request(json.dumps(ok).encode())[1] == "job_checkpoint_delete"
    for args in ({"job": "a"}, {"job": "a", "checkpoint": 1}, {"job": "a", "checkpoint": "x",
                                                               "path": "/"}):
        with pytest.raises(ProtocolError):
            parse_request(json.dumps(dict(ok, args=args)).encode())


def _ended(c: Any, job_id: str) -> Dict[str, Any]:
    job = c.job_get(job_id)
    return job if job.state in ("finished", "failed", "stopped", "lost") else None


@pytest.mark.skipif(sys.platform == "win32", reason="symbolic links")
def test_the_engine_lists_and_deletes_only_in_the_jobs_folder(engine: EngineProcess,
                                                             tmp_path: Path) -> None:
    folder, victim = tmp_path / "ckpt", tmp_path / "victim"
    folder.mkdir()
    victim.mkdir()
    (victim / "latest.weights.h5").write_text("precious")
    script = REPO / "tests" / "scripts" / "runner" / "plain.py"
    spec = JobSpec(script=str(script), args=("exit", "0"), cwd=str(tmp_path),
                   checkpoint_dir=str(folder)).to_json()
    with engine.client(timeout=30) as c:
        job = c.job_start(spec)
        wait_for(lambda: _ended(c, job.id), 60, "the job to end")
        _fit(folder, 1, 14, 67)
        _fit(folder, 2, 0, 5)
        os.symlink(victim, folder / "fit-3")
        listing = c.job_checkpoints(job.id)
        assert [(x.name, x.epoch, x.step) for x in listing.checkpoints] == \
            [("fit-1", 14, 67), ("fit-2", 0, 5)]
        for hostile in ("fit-3", str(victim), "../victim", str(folder / ".." / "victim")):
            with pytest.raises(EngineError):
                c.job_checkpoint_delete(job.id, hostile)
        assert (victim / "latest.weights.h5").read_text() == "precious"
        assert c.job_checkpoint_delete(job.id, "fit-2")["deleted"] == "fit-2"
        assert [x.name for x in c.job_checkpoints(job.id).checkpoints] == ["fit-1"]
        with pytest.raises(EngineError, match="no job"):
            c.job_checkpoints("nosuchjob")
        # A live job may be writing its checkpoint: none of it is deleted under it.
        live = c.job_start(dict(spec, args=["tick", "30"], resume=True))
        try:
            with pytest.raises(EngineError, match="once it is parked or has ended"):
                c.job_checkpoint_delete(live.id, "fit-1")
            assert (folder / "fit-1" / "latest.weights.h5").exists()
        finally:
            c.job_action(live.id, "kill")


def test_a_garbled_listing_reads_as_the_checkpoints_that_can_be_read() -> None:
    good = {"name": "fit-2", "fit": 2, "epoch": 3, "step": True, "time": "then", "weights": 1}
    listing = CheckpointListing.from_json({
        "job": 7, "folder": ["x"], "exists": "yes",
        "checkpoints": [good, {"name": "fit-1"}, {"fit": 1}, "fit-3", None, {"fit": 4}]})
    assert listing.job is None and listing.folder is None and listing.exists is False
    (only,) = listing.checkpoints
    assert (only.name, only.fit, only.epoch, only.step, only.time, only.weights) == \
        ("fit-2", 2, 3, None, None, False)
    assert CheckpointListing.from_json("not a listing") == CheckpointListing()
