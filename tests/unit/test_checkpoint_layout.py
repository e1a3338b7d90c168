"""The checkpoint folder's layout, one rule for what a ``fit-<n>`` folder is (runner.layout),
decided by what the runner writes: its fits are numbered from 1, written as ``str(n)``. The
runner (dropping old checkpoints), the engine's checkpoint manager (listing, deleting) and the
job manager (is there a checkpoint, how far did it get) all take the same names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trayapp.engine import checkpoints as ck
from trayapp.jobs import checkpoint_folder as cf
from trayapp.runner import layout, training
from trayapp.runner.job import Session

GOOD = [1, 2, 9, 10, 11, 99, 100, 2023, 123456789, layout.MAX_FIT]
BAD = [
    "fit-",  # no number
    "fit-0",  # the runner counts from 1
    "fit--1",
    "fit-+1",
    "fit-01",  # str(n) has no leading zero
    "fit-007",
    "fit-1x",
    "fit-x",
    "fit-1.0",
    "fit-1e3",
    "FIT-1",
    "Fit-1",
    "fit_1",
    "fit1",
    "fit-1 ",
    " fit-1",
    "fit-1\n",
    "fit- 1",
    "fit-" + "1" * (layout.MAX_FIT_DIGITS + 1),  # past the most a fit count gets to
    "fit-" + "9" * 200,
    "fit-\uff11",  # a full-width 1: str.isdigit says yes, the runner never writes it
    "fit-\u0661",  # an Arabic-Indic 1: int() reads it as 1
    "fit-2\u00b2",  # a superscript 2: isdigit() but not int()
    "fit-1/..",
    "fit-1/fit-2",
    "",
]


def _runner_dir(base: Path, fits: int) -> str:
    """The folder the runner's ``fits``-th fit() of a script writes its checkpoint in."""
    session = Session({"checkpoint_dir": str(base), "checkpoint_every_steps": None})
    index = 0
    for _ in range(fits):
        index = session.next_fit_index()
    run = training.FitRun(session, None, index, 1, True, True)
    return str(run.dir)


@pytest.mark.parametrize("n", GOOD)
def test_a_fit_folder_name_reads_back_as_its_number(n: int) -> None:
    name = layout.fit_dir_name(n)
    assert name == f"fit-{n}"
    assert layout.parse_fit_dir(name) == n


@pytest.mark.parametrize("name", BAD)
def test_a_name_the_runner_never_writes_is_no_fit_folder(name: str) -> None:
    assert layout.parse_fit_dir(name) is None


@pytest.mark.parametrize("value", [None, 1, b"fit-1", ["fit-1"]])
def test_what_is_not_a_name_is_no_fit_folder(value: Any) -> None:
    assert layout.parse_fit_dir(value) is None


@pytest.mark.parametrize("n", [0, -1, layout.MAX_FIT + 1, True, 1.0, "1", None])
def test_no_folder_name_for_what_is_not_a_fit_number(n: Any) -> None:
    with pytest.raises(ValueError):
        layout.fit_dir_name(n)


def test_the_runner_writes_its_fits_in_the_folders_the_rule_takes(tmp_path: Path) -> None:
    for fits in (1, 2, 3, 12):
        path = Path(_runner_dir(tmp_path, fits))
        assert path.parent == tmp_path
        assert layout.parse_fit_dir(path.name) == fits


def test_fit_folders_come_in_fit_order_and_others_are_left_out() -> None:
    names = ["fit-10", "fit-2", "fit-01", "notes.txt", "fit-1", "FIT-3"]
    assert layout.fit_dirs(names) == [(1, "fit-1"), (2, "fit-2"), (10, "fit-10")]


def _checkpoint(folder: Path, epoch: int = 4, done: int = 2) -> None:
    folder.mkdir(parents=True)
    (folder / layout.WEIGHTS_FILE).write_bytes(b"weights")
    (folder / layout.METADATA_FILE).write_text(json.dumps(
        {"epoch": epoch, "batch": done - 1, "headroom": {"batches_done": done, "accumulation": 1,
                                                          "finished": False}}))


# Names a file system takes as one folder name (no "/", not empty).
ON_DISK = [name for name in BAD if name and "/" not in name]


@pytest.mark.parametrize("name", ON_DISK)
def test_the_runner_engine_and_job_manager_leave_a_look_alike_alone(
        tmp_path: Path, name: str) -> None:
    _checkpoint(tmp_path / name)
    assert ck.list_checkpoints(str(tmp_path)).checkpoints == ()
    with pytest.raises(ValueError):
        ck.checkpoint_name(str(tmp_path), name)
    assert not cf.holds_checkpoint(str(tmp_path))
    assert cf.checkpoint_position(str(tmp_path)) == ("", False)
    training.drop_checkpoints(str(tmp_path))
    assert sorted(p.name for p in (tmp_path / name).iterdir()) == sorted(
        [layout.WEIGHTS_FILE, layout.METADATA_FILE])


def test_the_runner_engine_and_job_manager_take_a_runner_folder(tmp_path: Path) -> None:
    _checkpoint(Path(_runner_dir(tmp_path, 1)), epoch=3, done=0)
    _checkpoint(Path(_runner_dir(tmp_path, 2)), epoch=7, done=5)
    assert [c.fit for c in ck.list_checkpoints(str(tmp_path)).checkpoints] == [1, 2]
    assert ck.checkpoint_name(str(tmp_path), "fit-2") == "fit-2"
    assert cf.holds_checkpoint(str(tmp_path))
    assert cf.checkpoint_position(str(tmp_path)) == (" (epoch 8, batch 5)", False)  # the last fit
    training.drop_checkpoints(str(tmp_path))
    assert not tmp_path.exists()
