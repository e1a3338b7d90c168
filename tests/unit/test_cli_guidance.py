"""What the command line says to someone trying it for the first time: a tray started with no
display, a mistyped flag, a missing script, a list that looks empty, a checkpoint folder in use.
Each message names what is wrong and what to type instead, in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EngineProcess, headroom_cmd, run_cli
from trayapp.cli import main, no_display
from trayapp.jobs.options import JobSpec, SpecError, checkpoint_position, validate


def _usage(argv: list, capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="X11/Wayland only")
def test_the_tray_with_no_display_says_so_in_one_line(home: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    r = subprocess.run(headroom_cmd("--demo"), env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1, (r.returncode, r.stderr)  # not Qt's abort (-6) and a core dump
    assert r.stderr.startswith("headroom: no display to show the tray on"), r.stderr
    assert "'headroom run SCRIPT'" in r.stderr
    assert len(r.stderr.splitlines()) == 1 and "qt.qpa" not in r.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="X11/Wayland only")
def test_a_display_or_a_platform_without_one_lets_the_tray_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(name, raising=False)
    assert no_display()
    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")
    assert no_display()  # xcb needs a display as much as the default does
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    assert no_display() is None
    monkeypatch.setenv("QT_QPA_PLATFORM", "wayland;xcb")
    monkeypatch.setenv("DISPLAY", ":0")
    assert no_display() is None


def test_run_without_a_script_asks_for_the_script_only(home: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    err = _usage(["run"], capsys)
    assert "required: SCRIPT " in err and "SCRIPT_ARGS" not in err  # those may be empty
    assert "(see 'headroom run --help')" in err


def test_a_mistyped_flag_is_named_by_its_command_with_the_closest_one(
        home: Path, capsys: pytest.CaptureFixture) -> None:
    err = _usage(["run", "--chekpoint-dir", "ckpt", "train.py"], capsys)
    assert err.startswith("headroom run: unrecognized arguments: --chekpoint-dir")
    assert "did you mean --checkpoint-dir?" in err
    assert "(see 'headroom run --help')" in err
    err = _usage(["jobs", "--jsno"], capsys)
    assert "did you mean --json?" in err and "(see 'headroom jobs --help')" in err
    err = _usage(["status", "--zzz"], capsys)
    assert "did you mean" not in err and "(see 'headroom status --help')" in err


def test_jobs_with_none_live_says_where_the_ended_ones_are(engine: EngineProcess) -> None:
    r = run_cli("jobs", timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ("no running, paused or parked jobs ('headroom jobs --all' lists "
                                "the ended ones, stopped included)")
    r = run_cli("jobs", "--json", timeout=30)
    assert json.loads(r.stdout) == []  # what a program reads does not change


def _checkpoint(folder: Path, epoch: int, done: int, finished: bool) -> None:
    (folder / "fit-1").mkdir(parents=True)
    (folder / "fit-1" / "latest.weights.h5").write_bytes(b"weights")
    (folder / "fit-1" / "training_metadata.json").write_text(json.dumps(
        {"epoch": epoch, "batch": max(done - 1, 0),
         "headroom": {"batches_done": done, "finished": finished, "fit": 1}}))


def test_a_run_on_a_checkpoint_says_where_it_stands(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    mid, done, ended = tmp_path / "mid", tmp_path / "done", tmp_path / "ended"
    _checkpoint(mid, 21, 2, False)  # stopped at step 3 of "Epoch 22/30"
    _checkpoint(done, 26, 0, False)  # stopped at the end of "Epoch 26/30"
    _checkpoint(ended, 30, 0, True)  # fit() ran to its end
    assert checkpoint_position(str(mid)) == (" (epoch 22, batch 2)", False)
    assert checkpoint_position(str(done)) == (" (end of epoch 26)", False)
    assert checkpoint_position(str(ended)) == (" (end of epoch 30)", True)
    with pytest.raises(SpecError, match=r"holds a checkpoint \(epoch 22, batch 2\); "
                                        "continue from it with --resume, or start over"):
        validate(JobSpec(script=str(script), checkpoint_dir=str(mid)))
    # A finished run's checkpoint: --resume would train nothing, so --fresh comes first.
    with pytest.raises(SpecError, match=r"holds the checkpoint of a run that finished \(end of "
                                        r"epoch 30\); start over with --fresh .* or give "
                                        r"--resume to run only the script's code after fit\(\)"):
        validate(JobSpec(script=str(script), checkpoint_dir=str(ended)))


def test_an_unreadable_checkpoint_description_is_left_out(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    (folder / "fit-1").mkdir(parents=True)
    (folder / "fit-1" / "training_metadata.json").write_text("[" * 100000)
    assert checkpoint_position(str(folder)) == ("", False)
    (folder / "fit-1" / "training_metadata.json").write_text(
        json.dumps({"epoch": True, "headroom": {"batches_done": "x", "finished": 1}}))
    assert checkpoint_position(str(folder)) == ("", False)
    assert checkpoint_position(str(tmp_path / "none")) == ("", False)
