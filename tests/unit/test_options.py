"""Job specs: JSON round trip, validation (refusals and warnings), presets, `headroom run` flags."""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trayapp.jobs.options import (
    MIB,
    PRESETS,
    UNREAD_VARIABLES,
    JobSpec,
    MemoryOptions,
    SpecError,
    add_run_arguments,
    apply_preset,
    spec_from_cli,
    validate,
)
from trayapp.readings import GpuReading

GIB = 1024 * MIB


def gpu(index=0, total_mb=8192, display=None, name="Test GPU"):
    return GpuReading(
        index=index,
        name=name,
        uuid=f"GPU-{index:04d}",
        memory_total_bytes=None if total_mb is None else total_mb * MIB,
        memory_used_bytes=0,
        memory_free_bytes=None if total_mb is None else total_mb * MIB,
        display_active=display,
    )


@dataclass(frozen=True)
class CapableReading(GpuReading):
    """A reading that also carries NVML's compute capability."""

    compute_capability: Optional[str] = None


def capable(index=0, cap="8.6", total_mb=8192):
    return CapableReading(
        index=index,
        name="Test GPU",
        uuid=None,
        memory_total_bytes=total_mb * MIB,
        memory_used_bytes=0,
        memory_free_bytes=total_mb * MIB,
        compute_capability=cap,
    )


def spec(**options) -> JobSpec:
    extra = {k: options.pop(k) for k in list(options) if k in JobSpec.__dataclass_fields__}
    return JobSpec(script="train.py", options=MemoryOptions(**options), **extra)


# ---------------------------------------------------------------------------------------------
# JSON


opt_int = st.none() | st.integers(min_value=-5, max_value=1 << 20)
opt_bool = st.none() | st.booleans()
text = st.text(max_size=12)
specs = st.builds(
    JobSpec,
    script=text,
    args=st.lists(text, max_size=3).map(tuple),
    python=st.none() | text,
    name=st.none() | text,
    cwd=st.none() | text,
    env=st.lists(st.tuples(text, text), max_size=3).map(tuple),
    options=st.builds(
        MemoryOptions,
        gpus=st.none() | st.lists(st.integers(0, 7), max_size=3).map(tuple),
        cpu_only=st.booleans(),
        memory_growth=opt_bool,
        vram_limit_mb=opt_int,
        vram_reserve_mb=opt_int,
        allocator=st.none() | text,
        precision=st.none() | text,
        xla=opt_bool,
        intra_threads=opt_int,
        inter_threads=opt_int,
    ),
    ram_budget_mb=opt_int,
    vram_budget_mb=opt_int,
    checkpoint_dir=st.none() | text,
    checkpoint_every_steps=opt_int,
    resume=st.booleans(),
    preset=st.none() | text,
    auto_resume=opt_bool,
)


@given(specs)
def test_a_spec_survives_json(s):
    assert JobSpec.from_json(json.loads(json.dumps(s.to_json()))) == s


@pytest.mark.parametrize(
    "data, message",
    [
        ([], "expected a JSON object"),
        ({}, "'script' is missing"),
        ({"script": "t.py", "gpu": 1}, "unknown field 'gpu'"),
        ({"script": "t.py", "options": {"vram": 1}}, "unknown field 'options.vram'"),
        ({"script": 3}, "script must be a string"),
        ({"script": "t.py", "args": "a b"}, "args must be a list of strings"),
        ({"script": "t.py", "resume": "yes"}, "resume must be true or false"),
        ({"script": "t.py", "ram_budget_mb": 1.5}, "ram_budget_mb must be a whole number"),
        ({"script": "t.py", "ram_budget_mb": True}, "ram_budget_mb must be a whole number"),
        ({"script": "t.py", "options": {"gpus": [0, "1"]}}, "options.gpus must be a list"),
        ({"script": "t.py", "env": [["A"]]}, "env must be a list of [KEY, VALUE] pairs"),
        ({"script": "t.py", "options": []}, "options must be an object"),
    ],
)
def test_from_json_refuses_with_one_line(data, message):
    with pytest.raises(SpecError) as e:
        JobSpec.from_json(data)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_from_json_takes_env_as_an_object_too():
    s = JobSpec.from_json({"script": "t.py", "env": {"A": "1", "B": "2"}})
    assert s.env == (("A", "1"), ("B", "2"))


# ---------------------------------------------------------------------------------------------
# Validation: refusals


@pytest.mark.parametrize(
    "s, gpus, message",
    [
        (
            spec(memory_growth=True, vram_limit_mb=2048),
            (),
            "memory growth and a VRAM limit cannot be combined on one GPU in TensorFlow",
        ),
        (
            spec(memory_growth=True, vram_reserve_mb=512),
            (gpu(),),
            "memory growth and a VRAM limit cannot be combined",
        ),
        (
            spec(vram_limit_mb=20000),
            (gpu(total_mb=8192),),
            "--vram-limit: 20000 MiB is more than GPU 0 has (8192 MiB)",
        ),
        (
            spec(gpus=(1,), vram_limit_mb=9000),
            (gpu(0, 16384), gpu(1, 8192)),
            "more than GPU 1 has (8192 MiB)",
        ),
        (
            spec(vram_reserve_mb=8192),
            (gpu(total_mb=8192),),
            "--vram-reserve: 8192 MiB is not less than GPU 0's total (8192 MiB)",
        ),
        (spec(vram_reserve_mb=512), (gpu(total_mb=None),), "GPU 0's total memory is unknown"),
        (spec(vram_limit_mb=1024, vram_reserve_mb=512), (), "cannot be combined: choose one"),
        (spec(vram_limit_mb=0), (), "--vram-limit: 0 MiB is not a size"),
        (spec(vram_reserve_mb=-1), (), "--vram-reserve: -1 MiB"),
        (spec(ram_budget_mb=0), (), "--ram-budget: 0 MiB"),
        (spec(vram_budget_mb=-5), (), "--vram-budget: -5 MiB"),
        (spec(checkpoint_every_steps=0, checkpoint_dir="ck"), (), "--checkpoint-every: 0"),
        (spec(intra_threads=-1), (), "--threads: -1 is negative"),
        (spec(preset="fastest"), (), "--preset: unknown preset 'fastest'"),
        (spec(allocator="slab"), (), "--allocator: unknown allocator 'slab'"),
        (spec(precision="float16"), (), "--precision: unknown precision 'float16'"),
        (spec(cpu_only=True, gpus=(0,)), (), "--cpu-only and --gpu cannot be combined"),
        (spec(gpus=(2,)), (gpu(0), gpu(1)), "--gpu: there is no GPU 2 (this machine has GPU 0, 1)"),
        (spec(gpus=(0, 0)), (), "listed twice"),
        (spec(gpus=()), (), "--gpu: no GPU given"),
        (spec(gpus=(-1,)), (), "start at 0"),
        (spec(env=(("FOO", "1"), ("", "x"))), (), "--env: =x is not KEY=VALUE"),
        (spec(env=(("A=B", "x"),)), (), "is not KEY=VALUE"),
        (
            spec(env=(("HEADROOM_JOB_KEYFILE", "/k"),)),
            (),
            "--env: HEADROOM_JOB_KEYFILE is set by Headroom",
        ),
        (spec(resume=True), (), "--resume needs --checkpoint-dir"),
        (spec(checkpoint_every_steps=100), (), "--checkpoint-every needs --checkpoint-dir"),
        (spec(name="  "), (), "--name"),
    ],
)
def test_validate_refuses_what_cannot_work(s, gpus, message):
    with pytest.raises(SpecError) as e:
        validate(s, gpus, check_paths=False)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_validate_accepts_a_limit_within_the_gpu_and_a_reserve_below_its_total():
    assert validate(spec(vram_limit_mb=8192), (gpu(total_mb=8192),), check_paths=False) == []
    assert validate(spec(vram_reserve_mb=1024), (gpu(total_mb=8192),), check_paths=False) == []
    # "No growth" and a limit go together.
    assert validate(spec(memory_growth=False, vram_limit_mb=100), (gpu(),), check_paths=False) == []


# ---------------------------------------------------------------------------------------------
# Validation: warnings


@pytest.mark.parametrize("variable", sorted(UNREAD_VARIABLES))
def test_variables_tensorflow_does_not_read_earn_a_warning_naming_the_real_option(variable):
    warnings = validate(spec(env=((variable, "0.5"),)), (), check_paths=False)
    assert f"TensorFlow does not read {variable}; use {UNREAD_VARIABLES[variable]}" in warnings


def test_the_tf_memory_allocation_warning_reads_as_documented():
    warnings = validate(spec(env=(("TF_MEMORY_ALLOCATION", "0.5"),)), (), check_paths=False)
    assert warnings == [
        "TensorFlow does not read TF_MEMORY_ALLOCATION; use --vram-limit MiB (or --memory-growth)"
    ]


def test_real_tensorflow_variables_earn_no_warning():
    env = (("TF_GPU_ALLOCATOR", "cuda_malloc_async"), ("TF_CPP_MIN_LOG_LEVEL", "2"))
    assert validate(spec(env=env), (), check_paths=False) == []


def test_allow_growth_from_the_user_with_a_limit_is_a_warning():
    s = spec(vram_limit_mb=1024, env=(("TF_FORCE_GPU_ALLOW_GROWTH", "true"),))
    (warning,) = validate(s, (gpu(),), check_paths=False)
    assert warning.startswith("TF_FORCE_GPU_ALLOW_GROWTH=true (--env)")
    assert "cannot combine with a VRAM limit" in warning


def test_options_without_effect_on_the_cpu_are_warnings():
    warnings = validate(
        spec(cpu_only=True, vram_limit_mb=100, allocator="bfc"), (gpu(),), check_paths=False
    )
    assert "--vram-limit has no effect with --cpu-only" in warnings
    assert "--allocator has no effect with --cpu-only" in warnings


def test_without_gpu_readings_the_gpu_options_are_not_checked_but_said_so():
    (warning,) = validate(spec(vram_limit_mb=99999), (), check_paths=False)
    assert "not checked" in warning


# ---------------------------------------------------------------------------------------------
# Validation: paths


@pytest.fixture
def script(tmp_path: Path) -> Path:
    p = tmp_path / "train.py"
    p.write_text("print('hi')\n")
    return p


def test_paths_are_checked(tmp_path, script):
    ok = JobSpec(script=str(script), python=sys.executable, cwd=str(tmp_path))
    assert validate(ok) == []
    with pytest.raises(SpecError, match="^script not found: missing.py$"):
        validate(replace(ok, script="missing.py"))
    with pytest.raises(SpecError, match="--cwd: folder not found"):
        validate(replace(ok, cwd=str(tmp_path / "nowhere")))
    with pytest.raises(SpecError, match="--python: not found"):
        validate(replace(ok, python=str(tmp_path / "bin" / "python9")))
    with pytest.raises(SpecError, match="--python: not executable"):
        validate(replace(ok, python=str(script)))
    with pytest.raises(SpecError, match="--python: python-that-is-not-there not found on PATH"):
        validate(replace(ok, python="python-that-is-not-there"))
    (tmp_path / "pkg").mkdir()
    with pytest.raises(SpecError, match="a folder without __main__.py"):
        validate(replace(ok, script=str(tmp_path / "pkg")))
    (tmp_path / "pkg" / "__main__.py").write_text("")
    assert validate(replace(ok, script=str(tmp_path / "pkg"))) == []
    with pytest.raises(SpecError, match="--checkpoint-dir: not a folder"):
        validate(replace(ok, checkpoint_dir=str(script)))


def test_a_relative_script_is_found_from_the_spec_folder(tmp_path, script):
    assert validate(JobSpec(script="train.py", cwd=str(tmp_path))) == []


def test_an_executable_python_passes(tmp_path, script):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    assert validate(JobSpec(script=str(script), python=str(fake))) == []


# ---------------------------------------------------------------------------------------------
# Presets


def test_desktop_safe_is_growth_and_a_ram_budget():
    s = apply_preset(spec(), "desktop-safe", (gpu(display=False),), ram_total_bytes=16 * GIB)
    assert s.options.memory_growth is True and s.options.vram_reserve_mb is None
    assert s.ram_budget_mb == 12 * 1024  # 75 %
    assert s.preset == "desktop-safe"


def test_desktop_safe_leaves_1024_mb_free_on_a_gpu_driving_a_display():
    s = apply_preset(spec(), "desktop-safe", (gpu(0, display=True), gpu(1, display=False)))
    assert s.options.vram_reserve_mb == 1024
    assert s.options.memory_growth is None  # growth cannot go with a limit
    assert validate(s, (gpu(0, display=True), gpu(1, display=False)), check_paths=False) == []


def test_desktop_safe_with_an_unknown_display_is_growth():
    s = apply_preset(spec(), "desktop-safe", (gpu(display=None),))
    assert s.options.memory_growth is True


def test_desktop_safe_looks_only_at_the_chosen_gpus():
    s = apply_preset(spec(gpus=(1,)), "desktop-safe", (gpu(0, display=True), gpu(1, display=False)))
    assert s.options.memory_growth is True


def test_throughput_on_a_recent_gpu():
    s = apply_preset(spec(), "throughput", (capable(cap="8.6"),))
    o = s.options
    assert (o.memory_growth, o.allocator, o.precision, o.xla) == (
        False,
        "cuda_malloc_async",
        "mixed_float16",
        True,
    )
    assert validate(s, (capable(cap="8.6"),), check_paths=False) == []


def test_throughput_keeps_float32_when_the_capability_is_unknown_or_too_low_and_says_so():
    s = apply_preset(spec(), "throughput", (gpu(),))
    assert s.options.precision is None
    (warning,) = validate(s, (gpu(),), check_paths=False)
    assert "compute capability is unknown, so precision stays float32" in warning
    old = (capable(cap="6.1"),)
    s = apply_preset(spec(), "throughput", old)
    assert s.options.precision is None
    (warning,) = validate(s, old, check_paths=False)
    assert "GPU 0 has compute capability 6.1" in warning


def test_cpu_only_preset():
    assert apply_preset(spec(), "cpu-only").options.cpu_only is True
    with pytest.raises(SpecError, match="cpu-only cannot be combined with --gpu"):
        apply_preset(spec(gpus=(0,)), "cpu-only")


@pytest.mark.parametrize(
    "user, field, value",
    [
        (dict(vram_limit_mb=4096), "memory_growth", None),  # the VRAM group is the user's
        (dict(memory_growth=False), "memory_growth", False),
        (dict(vram_reserve_mb=2048), "vram_reserve_mb", 2048),
        (dict(ram_budget_mb=1000), "ram_budget_mb", 1000),
    ],
)
def test_explicit_choices_win_over_desktop_safe(user, field, value):
    s = apply_preset(spec(**user), "desktop-safe", (gpu(display=True),), ram_total_bytes=GIB * 8)
    got = getattr(s, field) if field == "ram_budget_mb" else getattr(s.options, field)
    assert got == value
    validate(s, (gpu(display=True),), check_paths=False)  # never a contradiction


def test_explicit_choices_win_over_throughput():
    s = apply_preset(
        spec(precision="float32", xla=False, allocator="bfc"), "throughput", (capable(),)
    )
    assert (s.options.precision, s.options.xla, s.options.allocator) == ("float32", False, "bfc")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_applying_a_preset_twice_changes_nothing(name):
    readings = (gpu(display=True), gpu(1, display=False))
    once = apply_preset(spec(), name, readings, ram_total_bytes=GIB * 4)
    assert apply_preset(once, name, readings, ram_total_bytes=GIB * 4) == once


def test_unknown_preset():
    with pytest.raises(SpecError, match="--preset: unknown preset 'x'"):
        apply_preset(spec(), "x")


# ---------------------------------------------------------------------------------------------
# headroom run


@pytest.fixture
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="headroom run")
    add_run_arguments(p)
    return p


def test_every_flag_reaches_the_spec(parser, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ns = parser.parse_args(
        [
            "--python", sys.executable, "--gpu", "0,1", "--no-memory-growth",
            "--vram-limit", "4096", "--allocator", "cuda_malloc_async",
            "--precision", "mixed_bfloat16", "--xla", "--threads", "4,2",
            "--ram-budget", "8GiB", "--vram-budget", "6000", "--checkpoint-dir", "ck",
            "--checkpoint-every", "500", "--resume", "--preset", "throughput",
            "--name", "mnist", "--env", "A=1", "--env", "B=x=y", "--manual-resume",
            "train.py", "--lr", "0.1",
        ]
    )  # fmt: skip
    s = spec_from_cli(ns)
    assert s.script == str(tmp_path / "train.py")
    assert s.args == ("--lr", "0.1")
    assert s.python == sys.executable
    assert s.cwd == str(tmp_path)
    assert s.env == (("A", "1"), ("B", "x=y"))
    assert s.options == MemoryOptions(
        gpus=(0, 1),
        memory_growth=False,
        vram_limit_mb=4096,
        allocator="cuda_malloc_async",
        precision="mixed_bfloat16",
        xla=True,
        intra_threads=4,
        inter_threads=2,
    )
    assert (s.ram_budget_mb, s.vram_budget_mb) == (8192, 6000)
    assert s.checkpoint_dir == str(tmp_path / "ck")
    assert (s.checkpoint_every_steps, s.resume, s.preset, s.name) == (
        500,
        True,
        "throughput",
        "mnist",
    )
    assert s.auto_resume is False
    assert ns.dry_run is False


def test_defaults_leave_everything_to_tensorflow(parser, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = spec_from_cli(parser.parse_args(["--cpu-only", "--dry-run", "train.py", "--", "-x"]))
    assert s.options == MemoryOptions(cpu_only=True)
    assert s.args == ("-x",)
    assert s.python is None and s.auto_resume is None and s.resume is False
    assert s.cwd == os.getcwd()


def test_the_scripts_own_flags_after_the_script_stay_the_scripts(parser):
    s = spec_from_cli(parser.parse_args(["train.py", "--gpu", "3", "--name", "x"]))
    assert s.args == ("--gpu", "3", "--name", "x")
    assert s.options.gpus is None and s.name is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gpu", "a", "t.py"], "--gpu: expected GPU numbers"),
        (["--threads", "x", "t.py"], "--threads: expected INTRA or INTRA,INTER"),
        (["--threads", "1,2,3", "t.py"], "--threads"),
        (["--vram-limit", "lots", "t.py"], "--vram-limit: 'lots' is not a size (like 4096"),
        (["--vram-limit", "512KiB", "t.py"], "--vram-limit: '512KiB' is less than 1 MiB"),
        (["--env", "NOVALUE", "t.py"], "--env: 'NOVALUE' is not KEY=VALUE"),
        (["--checkpoint-every", "often", "t.py"], "--checkpoint-every: 'often' is not a number"),
        (
            ["--python", "no-such-python-here", "t.py"],
            "--python: no-such-python-here not found on PATH",
        ),
    ],
)
def test_bad_flag_values_are_one_line(parser, argv, message):
    with pytest.raises(SpecError) as e:
        spec_from_cli(parser.parse_args(argv))
    assert message in str(e.value)


def test_exclusive_flags_are_refused_by_the_parser(parser, capsys):
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["--cpu-only", "--gpu", "0", "t.py"])
    assert e.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
