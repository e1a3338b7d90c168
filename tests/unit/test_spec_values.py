"""The values of a job spec as typed: one rule per kind of value for ``headroom run`` and the
launch dialog, and the spec field each refusal names."""

from __future__ import annotations

import argparse

import pytest

from trayapp.jobs import spec_values as sv
from trayapp.jobs.options import JobSpec, MemoryOptions, SpecError, spec_from_cli, validate
from trayapp.jobs.plan import build_launch


def cli_spec(*argv: str) -> JobSpec:
    parser = argparse.ArgumentParser()
    sv.add_run_arguments(parser)
    return spec_from_cli(parser.parse_args([*argv, "t.py"]))


@pytest.mark.parametrize("typed, mb", [
    ("4096", 4096), ("12 GiB", 12288), ("1MiB", 1), (" 2048 ", 2048), ("", None),
])
def test_a_size_reads_the_same_on_the_command_line_and_in_the_dialog(typed, mb):  # type: ignore
    assert sv.parse_mb("--ram-budget", typed) == mb
    if typed.strip():
        assert cli_spec("--ram-budget", typed).ram_budget_mb == mb


@pytest.mark.parametrize("typed, words", [
    ("512KiB", "'512KiB' is less than 1 MiB"), ("lots", "'lots' is not a size"),
])
def test_a_size_under_1_mb_or_not_a_size_is_refused_by_both(typed, words):  # type: ignore
    with pytest.raises(SpecError, match=words) as e:
        sv.parse_mb("--ram-budget", typed, sv.RAM_BUDGET)
    assert e.value.field == sv.RAM_BUDGET
    with pytest.raises(SpecError, match=words) as e:
        cli_spec("--ram-budget", typed)
    assert e.value.field == sv.RAM_BUDGET


def test_zero_mb_as_a_number_is_refused_by_validate_naming_the_flag() -> None:
    s = cli_spec("--vram-budget", "0")
    assert s.vram_budget_mb == 0
    with pytest.raises(SpecError, match="--vram-budget: 0 MiB is not a size") as e:
        validate(s, check_paths=False)
    assert e.value.field == sv.VRAM_BUDGET


def test_env_entries_read_the_same_on_the_command_line_and_in_the_dialog() -> None:
    lines = "A=1\n B =x=y\n# a note\n\nC="
    assert sv.parse_env_lines(lines) == (("A", "1"), ("B", "x=y"), ("C", ""))
    assert cli_spec("--env", "A=1", "--env", " B =x=y", "--env", "C=").env == \
        (("A", "1"), ("B", "x=y"), ("C", ""))
    for bad in ("NOVALUE", "=x"):
        with pytest.raises(SpecError, match=f"--env: '{bad}' is not KEY=VALUE") as e:
            sv.parse_env_lines(bad)
        assert e.value.field == sv.ENV
        with pytest.raises(SpecError, match=f"--env: '{bad}' is not KEY=VALUE"):
            cli_spec("--env", bad)


@pytest.mark.parametrize("spec, field", [
    (JobSpec(script="t.py", options=MemoryOptions(vram_limit_mb=0)), sv.VRAM_LIMIT),
    (JobSpec(script="t.py", options=MemoryOptions(gpus=(0, 0))), sv.GPUS),
    (JobSpec(script="t.py", options=MemoryOptions(cpu_only=True, gpus=(0,))), sv.CPU_ONLY),
    (JobSpec(script="t.py", options=MemoryOptions(memory_growth=True, vram_reserve_mb=9)),
     sv.MEMORY_GROWTH),
    (JobSpec(script="t.py", options=MemoryOptions(allocator="slab")), sv.ALLOCATOR),
    (JobSpec(script="t.py", options=MemoryOptions(intra_threads=-1)), sv.THREADS),
    (JobSpec(script="t.py", fresh=True), sv.FRESH),
    (JobSpec(script="t.py", fresh=True, resume=True, checkpoint_dir="c"), sv.RESUME),
    (JobSpec(script="t.py", checkpoint_every_steps=5), sv.CHECKPOINT_EVERY),
    (JobSpec(script="t.py", env=(("HEADROOM_JOB_KEYFILE", "k"),)), sv.ENV),
    (JobSpec(script="t.py", name=" "), sv.NAME),
    (JobSpec(script="t.py", preset="fastest"), sv.PRESET),
])
def test_each_refusal_names_its_field(spec, field):  # type: ignore[no-untyped-def]
    with pytest.raises(SpecError) as e:
        validate(spec, check_paths=False)
    assert e.value.field == field


def test_json_type_errors_name_their_field() -> None:
    with pytest.raises(SpecError) as e:
        JobSpec.from_json({"script": "t.py", "options": {"vram_limit_mb": "big"}})
    assert e.value.field == "options.vram_limit_mb"


def test_a_plan_refused_for_its_reserve_names_the_reserve() -> None:
    spec = JobSpec(script="t.py", options=MemoryOptions(vram_reserve_mb=512))
    with pytest.raises(SpecError) as e:
        build_launch(spec, job_id="x", gpus=(), base_env={})
    assert e.value.field == sv.VRAM_RESERVE
