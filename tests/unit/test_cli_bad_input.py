"""What ``headroom run`` says before it starts anything: the guard's part of a dry run's plan,
and each bad input as one line with its exit status (a RAM budget under what TensorFlow alone
takes is a warning; a checkpoint folder that cannot be written and a --config file that is not
there are errors, exit 2)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, List

import pytest

from trayapp.cli import main
from trayapp.config import Config
from trayapp.jobs.options import TF_RAM_FLOOR_MB, JobSpec, SpecError, validate
from trayapp.jobs.plan import guard_lines

REPO = Path(__file__).resolve().parents[2]
TICKER = str(REPO / "tests" / "scripts" / "jobs" / "ticker.py")


def run(capsys: Any, *argv: str) -> tuple:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def unwritable(tmp_path: Path) -> str:
    """A folder this process cannot write in (root writes anywhere a mode allows: /sys)."""
    if os.geteuid() == 0:
        return "/sys/headroom-checkpoints"
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    return str(folder / "ckpt")


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes")
def test_an_unwritable_checkpoint_folder_is_one_line_exit_2(home: Path, tmp_path: Path,
                                                           capsys: Any) -> None:
    folder = unwritable(tmp_path)
    code, out, err = run(capsys, "run", "--dry-run", "--checkpoint-dir", folder, TICKER)
    assert code == 2 and out == ""
    assert "--checkpoint-dir: cannot write in" in one_line(err)
    code, _, err = run(capsys, "run", "--checkpoint-dir", TICKER, TICKER)  # a file
    assert code == 2 and "not a folder" in one_line(err)


def test_a_missing_config_file_is_one_line_exit_2(home: Path, tmp_path: Path,
                                                  capsys: Any) -> None:
    missing = str(tmp_path / "nope.toml")
    for argv in (["status"], ["jobs"], ["run", "--dry-run", TICKER], ["logs", "x"]):
        code, out, err = run(capsys, "--config", missing, *argv)
        assert code == 2 and out == "", argv
        assert f"--config: no such file: {missing}" in one_line(err)
    code, out, err = run(capsys, "status", "--config", str(tmp_path))
    assert code == 2 and "not a file" in one_line(err)
    # The file there: fine.
    (tmp_path / "ok.toml").write_text("")
    code, out, _ = run(capsys, "run", "--dry-run", "--config", str(tmp_path / "ok.toml"), TICKER)
    assert code == 0 and "The guard:" in out


def test_a_ram_budget_under_tensorflows_own_is_a_warning_with_the_number(
        home: Path, capsys: Any) -> None:
    (warning,) = [w for w in validate(JobSpec(script=TICKER, ram_budget_mb=1),
                                      check_paths=False) if "--ram-budget" in w]
    assert f"{TF_RAM_FLOOR_MB} MiB" in warning and "--ram-budget 1 MiB" in warning
    assert not [w for w in validate(JobSpec(script=TICKER, ram_budget_mb=4096),
                                    check_paths=False) if "--ram-budget" in w]
    code, out, err = run(capsys, "run", "--dry-run", "--ram-budget", "1", TICKER)
    assert code == 0, err
    assert f"! --ram-budget 1 MiB is below the {TF_RAM_FLOOR_MB} MiB" in out
    with pytest.raises(SpecError):
        validate(JobSpec(script=TICKER, ram_budget_mb=0), check_paths=False)


def guard_of(spec: JobSpec, **settings: Any) -> List[str]:
    config = Config()
    values = dict(config.values)
    values.update({f"guard.{k}": v for k, v in settings.items()})
    return guard_lines(spec, values)


def test_the_dry_runs_plan_has_the_guards_part(home: Path, tmp_path: Path,
                                               capsys: Any) -> None:
    code, out, _ = run(capsys, "run", "--dry-run", "--ram-budget", "12288", "--vram-budget",
                       "4096", "--checkpoint-dir", str(tmp_path / "ck"), TICKER)
    assert code == 0
    guard = out.split("The guard:\n")[1].split("\n\n")[0]
    assert "RAM budget: 12.0 GiB (--ram-budget): a warning at 90% (10.8 GiB), a pause at " \
           "12.0 GiB" in guard
    assert "VRAM budget: 4.0 GiB" in guard
    assert "a warning below 15% available, a pause below 8%, a park below 5%, a stop below " \
           "2%" in guard
    assert f"park: a checkpoint in {tmp_path / 'ck'}" in guard and "exit status 75" in guard
    assert "resume: by itself, once more than 20% is available for 10 s" in guard


def test_the_guards_part_follows_the_spec_and_the_settings() -> None:
    bare = "\n".join(guard_of(JobSpec(script=TICKER)))
    assert "RAM budget: none (--ram-budget)" in bare
    assert "park: not for this job (no --checkpoint-dir" in bare
    manual = "\n".join(guard_of(JobSpec(script=TICKER, auto_resume=False)))
    assert "resume: only by you ('headroom resume'; --manual-resume)" in manual
    setting = "\n".join(guard_of(JobSpec(script=TICKER), auto_resume=False, mode="dry-run"))
    assert "setting guard.auto_resume" in setting
    assert "mode: records what it would do and does nothing" in setting
    assert "a pause below 30%" in "\n".join(guard_of(JobSpec(script=TICKER),
                                                     pause_available="30%"))


def test_a_preset_budget_is_in_the_dry_run(home: Path, capsys: Any) -> None:
    code, out, _ = run(capsys, "run", "--dry-run", "--preset", "desktop-safe", TICKER)
    assert code == 0
    # desktop-safe: a RAM budget of 75% of this machine's RAM, as the engine would apply it.
    assert "\n  RAM budget: none" not in out and "\n  RAM budget: " in out


def test_sizes_given_in_si_units_are_shown_in_binary_ones(home: Path, capsys: Any) -> None:
    # "12GB" is 12 * 10**9 bytes (SI), 11444 MiB: shown as the binary size it is, never "MB".
    code, out, err = run(capsys, "run", "--dry-run", "--ram-budget", "12GB", TICKER)
    assert code == 0, err
    assert "RAM budget: 11.2 GiB (--ram-budget)" in out
    assert " MB" not in out
