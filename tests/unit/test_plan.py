"""Launch plans: argv, environment and runner options per option and preset, without starting
anything."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import trayapp
from trayapp.jobs.interpreters import REMOVED
from trayapp.jobs.options import MIB, JobSpec, MemoryOptions, SpecError
from trayapp.jobs.plan import build_launch, default_runner_dir, format_plan, runner_steps
from trayapp.readings import GpuReading
from trayapp.runner import protocol

BASE = {"PATH": "/usr/bin:/bin", "HOME": "/home/u", "LANG": "C.UTF-8"}


def gpu(index=0, total_mb=8192, display=None, uuid=None):
    return GpuReading(
        index=index,
        name="Test GPU",
        uuid=uuid or f"GPU-{index}aaa",
        memory_total_bytes=total_mb * MIB,
        memory_used_bytes=0,
        memory_free_bytes=total_mb * MIB,
        display_active=display,
    )


@pytest.fixture
def script(tmp_path: Path) -> Path:
    p = tmp_path / "project" / "train.py"
    p.parent.mkdir()
    p.write_text("print('hi')\n")
    return p


def plan_for(script: Path, base=None, gpus=(), **fields):
    options = fields.pop("options", MemoryOptions())
    fields.setdefault("python", sys.executable)
    spec = JobSpec(script=str(script), options=options, **fields)
    return build_launch(spec, gpus=gpus, base_env=dict(BASE if base is None else base))


def reasons(plan) -> dict:
    return {name: (value, why) for name, value, why in plan.settings}


def test_the_command_runs_the_runner_in_the_jobs_python(script):
    plan = plan_for(script, args=("--lr", "0.1"))
    python, bootstrap, target, *args = plan.argv
    assert python == sys.executable
    assert Path(bootstrap) == default_runner_dir() / "bootstrap.py"
    assert Path(bootstrap).is_file()
    assert (target, args) == (str(script), ["--lr", "0.1"])
    assert plan.cwd == str(script.parent)  # no cwd given: the script's folder


def test_every_plan_has_a_live_log_and_the_job_channel(script):
    plan = build_launch(
        JobSpec(script=str(script), python=sys.executable),
        job_id="abc123",
        address="/run/headroom/abc123.sock",
        keyfile="/run/headroom/abc123.key",
        base_env=BASE,
    )
    env = plan.env
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env[protocol.ENV_JOB_ID] == "abc123"
    assert env[protocol.ENV_ADDRESS] == "/run/headroom/abc123.sock"
    assert env[protocol.ENV_KEYFILE] == "/run/headroom/abc123.key"
    assert json.loads(env[protocol.ENV_OPTIONS]) == plan.runner_options
    assert env["HOME"] == "/home/u" and env["LANG"] == "C.UTF-8"  # the rest is the caller's
    why = reasons(plan)
    assert "removes this variable" in why[protocol.ENV_KEYFILE][1]
    assert all(reason for _, _, reason in plan.settings)


def test_a_dry_run_plan_has_no_channel_and_nothing_of_an_old_job(script):
    base = dict(BASE, HEADROOM_JOB_ADDRESS="/old", HEADROOM_JOB_KEYFILE="/old.key")
    plan = plan_for(script, base=base)
    assert protocol.ENV_ADDRESS not in plan.env
    assert protocol.ENV_KEYFILE not in plan.env
    assert plan.env[protocol.ENV_JOB_ID] == "dry-run"


def test_defaults_change_nothing_in_tensorflow(script):
    plan = plan_for(script)
    for name in ("CUDA_VISIBLE_DEVICES", "TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_ALLOCATOR"):
        assert name not in plan.env
    assert plan.runner_options == {
        "memory_growth": None,
        "vram_limit_mb": None,
        "vram_option": None,
        "precision": None,
        "xla": None,
        "intra_threads": None,
        "inter_threads": None,
        "checkpoint_dir": None,
        "checkpoint_every_steps": None,
        "resume": False,
        "on_oom": "shrink",
        "min_batch": 8,
        "accumulation": 1,
        "fit_batch": True,  # the probe before the first full step (no TensorFlow setting)
    }
    assert runner_steps(plan.runner_options) == []


@pytest.mark.parametrize(
    "options, env, runner",
    [
        (MemoryOptions(cpu_only=True), {"CUDA_VISIBLE_DEVICES": "-1"}, {}),
        (
            MemoryOptions(gpus=(0, 2)),
            {"CUDA_VISIBLE_DEVICES": "0,2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
            {},
        ),
        (
            MemoryOptions(memory_growth=True),
            {"TF_FORCE_GPU_ALLOW_GROWTH": "true"},
            {"memory_growth": True},
        ),
        (
            MemoryOptions(memory_growth=False),
            {"TF_FORCE_GPU_ALLOW_GROWTH": "false"},
            {"memory_growth": False},
        ),
        (
            MemoryOptions(allocator="cuda_malloc_async"),
            {"TF_GPU_ALLOCATOR": "cuda_malloc_async"},
            {},
        ),
        (
            MemoryOptions(vram_limit_mb=3000),
            {},
            {"vram_limit_mb": 3000, "vram_option": "--vram-limit"},
        ),
        (MemoryOptions(precision="mixed_float16"), {}, {"precision": "mixed_float16"}),
        (MemoryOptions(xla=False), {}, {"xla": False}),
        (
            MemoryOptions(intra_threads=4, inter_threads=2),
            {},
            {"intra_threads": 4, "inter_threads": 2},
        ),
        # Growth means nothing without a GPU: the runner does not even import TensorFlow for it.
        (MemoryOptions(cpu_only=True, memory_growth=True), {"CUDA_VISIBLE_DEVICES": "-1"}, {}),
    ],
)
def test_each_option_becomes_its_real_knob(script, options, env, runner):
    plan = plan_for(script, options=options, gpus=(gpu(0), gpu(1), gpu(2)))
    for name, value in env.items():
        assert plan.env[name] == value
        assert reasons(plan)[name][1]
    for key, value in runner.items():
        assert plan.runner_options[key] == value
    others = {"memory_growth", "vram_limit_mb", "precision", "xla", "intra_threads"} - set(runner)
    for key in others:
        assert plan.runner_options[key] is None


def test_a_reserve_is_each_gpus_total_minus_the_reserve(script):
    readings = (gpu(0, 24576), gpu(1, 8192))
    plan = plan_for(script, options=MemoryOptions(vram_reserve_mb=1024), gpus=readings)
    assert plan.runner_options["vram_limit_mb"] == [23552, 7168]
    assert plan.runner_options["vram_option"] == "--vram-reserve"
    assert plan.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # TensorFlow's order = NVML's
    one = plan_for(script, options=MemoryOptions(gpus=(1,), vram_reserve_mb=1024), gpus=readings)
    assert one.runner_options["vram_limit_mb"] == [7168]


def test_a_reserve_follows_the_users_cuda_visible_devices(script):
    readings = (gpu(0, 24576, uuid="GPU-aaaa"), gpu(1, 8192, uuid="GPU-bbbb"))
    base = dict(BASE, CUDA_VISIBLE_DEVICES="1")
    plan = plan_for(script, base=base, options=MemoryOptions(vram_reserve_mb=1024), gpus=readings)
    assert plan.runner_options["vram_limit_mb"] == [7168]
    base = dict(BASE, CUDA_VISIBLE_DEVICES="GPU-bbbb,GPU-aaaa")
    plan = plan_for(script, base=base, options=MemoryOptions(vram_reserve_mb=1024), gpus=readings)
    assert plan.runner_options["vram_limit_mb"] == [7168, 23552]
    base = dict(BASE, CUDA_VISIBLE_DEVICES="MIG-1234")
    with pytest.raises(SpecError, match="cannot tell the total memory of each GPU"):
        plan_for(script, base=base, options=MemoryOptions(vram_reserve_mb=1024), gpus=readings)


def test_a_reserve_needs_gpu_readings(script):
    with pytest.raises(SpecError, match="--vram-reserve: the GPUs' total memory is unknown"):
        plan_for(script, options=MemoryOptions(vram_reserve_mb=1024))


def test_a_plan_is_never_built_from_a_spec_that_cannot_run(script):
    with pytest.raises(SpecError, match="cannot be combined on one GPU"):
        plan_for(script, options=MemoryOptions(memory_growth=True, vram_limit_mb=100))


def test_bfc_removes_an_inherited_allocator(script):
    base = dict(BASE, TF_GPU_ALLOCATOR="cuda_malloc_async")
    plan = plan_for(script, base=base, options=MemoryOptions(allocator="bfc"))
    assert "TF_GPU_ALLOCATOR" not in plan.env
    assert reasons(plan)["TF_GPU_ALLOCATOR"][0] == REMOVED


def test_inherited_growth_is_removed_for_a_limit(script):
    base = dict(BASE, TF_FORCE_GPU_ALLOW_GROWTH="true")
    plan = plan_for(script, base=base, options=MemoryOptions(vram_limit_mb=2048), gpus=(gpu(),))
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in plan.env
    assert "cannot be combined" in reasons(plan)["TF_FORCE_GPU_ALLOW_GROWTH"][1]
    assert plan.warnings == ()


def test_checkpoint_options_reach_the_runner(script, tmp_path):
    plan = plan_for(
        script,
        checkpoint_dir=str(tmp_path / "ck"),
        checkpoint_every_steps=200,
        resume=True,
    )
    r = plan.runner_options
    assert (r["checkpoint_dir"], r["checkpoint_every_steps"], r["resume"]) == (
        str(tmp_path / "ck"),
        200,
        True,
    )


# ---------------------------------------------------------------------------------------------
# Presets


def test_desktop_safe_on_a_display_gpu_is_a_limit_below_the_total(script):
    plan = plan_for(script, preset="desktop-safe", gpus=(gpu(0, 8192, display=True),))
    assert plan.runner_options["vram_limit_mb"] == [8192 - 1024]
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in plan.env


def test_desktop_safe_elsewhere_is_growth(script):
    plan = plan_for(script, preset="desktop-safe", gpus=(gpu(0, display=False),))
    assert plan.env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert plan.runner_options["memory_growth"] is True


def test_throughput_preset(script):
    plan = plan_for(script, preset="throughput", gpus=(gpu(),))
    assert plan.env["TF_GPU_ALLOCATOR"] == "cuda_malloc_async"
    assert plan.env["TF_FORCE_GPU_ALLOW_GROWTH"] == "false"
    assert plan.runner_options["xla"] is True
    assert plan.runner_options["precision"] is None  # capability unknown: float32, said so
    assert any("compute capability is unknown" in w for w in plan.warnings)


def test_cpu_only_preset(script):
    plan = plan_for(script, preset="cpu-only")
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "-1"


def test_a_user_choice_beats_the_preset(script):
    plan = plan_for(
        script,
        preset="desktop-safe",
        options=MemoryOptions(vram_limit_mb=4000),
        gpus=(gpu(0, 8192, display=True),),
    )
    assert plan.runner_options["vram_limit_mb"] == 4000
    assert plan.runner_options["memory_growth"] is None


# ---------------------------------------------------------------------------------------------
# The caller's environment


def test_variables_tensorflow_ignores_in_the_callers_environment_are_warned(script):
    plan = plan_for(script, base=dict(BASE, TF_GPU_MEMORY_FRACTION="0.5"))
    assert "TensorFlow does not read TF_GPU_MEMORY_FRACTION; use --vram-limit MiB" in plan.warnings
    assert plan.env["TF_GPU_MEMORY_FRACTION"] == "0.5"  # left alone, only explained


def test_the_users_env_comes_last_and_a_replaced_setting_is_said(script):
    plan = plan_for(
        script,
        options=MemoryOptions(gpus=(0,)),
        env=(("CUDA_VISIBLE_DEVICES", "1"), ("MY_FLAG", "on")),
        gpus=(gpu(0), gpu(1)),
    )
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert plan.env["MY_FLAG"] == "on"
    assert reasons(plan)["MY_FLAG"] == ("on", "--env")
    # Named, not shown: the job keeps its warnings, and --env values are kept nowhere else.
    assert "--env CUDA_VISIBLE_DEVICES replaces Headroom's CUDA_VISIBLE_DEVICES=0" in \
        plan.warnings


@pytest.fixture
def other_venv(tmp_path: Path) -> Path:
    """A virtualenv that is not Headroom's: pyvenv.cfg and an executable bin/python."""
    venv = tmp_path / "project" / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    python = venv / "bin" / "python"
    python.symlink_to(sys.executable)
    return venv


HEADROOM_SITE = os.path.dirname(os.path.dirname(os.path.abspath(trayapp.__file__)))


def test_headroom_pythonpath_does_not_reach_another_python(script, other_venv):
    base = dict(BASE, PYTHONPATH=os.pathsep.join([HEADROOM_SITE, "/opt/mine"]))
    plan = plan_for(script, base=base, python=None)  # the venv beside the script
    assert plan.argv[0] == str(other_venv / "bin" / "python")
    assert plan.env["PYTHONPATH"] == "/opt/mine"
    assert "Headroom's own install" in reasons(plan)["PYTHONPATH"][1]
    # The job's venv is active, as if the user had activated it.
    assert plan.env["VIRTUAL_ENV"] == str(other_venv)
    assert plan.env["PATH"].split(os.pathsep)[0] == str(other_venv / "bin")


def test_headroom_pythonhome_is_removed_for_another_python(script, other_venv):
    plan = plan_for(script, base=dict(BASE, PYTHONHOME=HEADROOM_SITE), python=None)
    assert "PYTHONHOME" not in plan.env
    assert reasons(plan)["PYTHONHOME"][0] == REMOVED


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="Headroom is not running in a venv")
def test_headroom_virtualenv_does_not_reach_another_python(script, other_venv):
    own_bin = os.path.join(sys.prefix, "bin")
    base = dict(BASE, VIRTUAL_ENV=sys.prefix, PATH=os.pathsep.join([own_bin, "/usr/bin"]))
    plan = plan_for(script, base=base, python=None)
    assert plan.env["VIRTUAL_ENV"] == str(other_venv)
    assert own_bin not in plan.env["PATH"].split(os.pathsep)
    assert "/usr/bin" in plan.env["PATH"].split(os.pathsep)


def test_headroom_own_python_keeps_its_environment(script):
    base = dict(BASE, PYTHONPATH=HEADROOM_SITE)
    plan = plan_for(script, base=base, python=sys.executable)
    assert plan.env["PYTHONPATH"] == HEADROOM_SITE


def test_a_conda_environment_is_activated(script, tmp_path):
    prefix = tmp_path / "conda" / "envs" / "tf"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "conda-meta").mkdir()
    python = prefix / "bin" / "python"
    python.symlink_to(sys.executable)
    plan = plan_for(script, python=str(python))
    assert plan.env["CONDA_PREFIX"] == str(prefix)
    assert plan.env["PATH"].split(os.pathsep)[0] == str(prefix / "bin")


def test_a_frozen_build_restores_the_library_path_and_drops_its_bundle(script, tmp_path):
    bundle = tmp_path / "bundle"
    base = dict(
        BASE,
        LD_LIBRARY_PATH=str(bundle),
        LD_LIBRARY_PATH_ORIG="/usr/local/cuda/lib64",
        QT_PLUGIN_PATH=str(bundle / "PySide6" / "plugins"),
        XDG_DATA_DIRS=os.pathsep.join([str(bundle / "share"), "/usr/share"]),
    )
    spec = JobSpec(script=str(script), python=sys.executable)
    plan = build_launch(spec, base_env=base, frozen=True, bundle_dir=str(bundle))
    env = plan.env
    assert env["LD_LIBRARY_PATH"] == "/usr/local/cuda/lib64"
    assert "LD_LIBRARY_PATH_ORIG" not in env
    assert "QT_PLUGIN_PATH" not in env
    assert env["XDG_DATA_DIRS"] == "/usr/share"
    assert "before Headroom's app bundle" in reasons(plan)["LD_LIBRARY_PATH"][1]
    # Without a saved value, the bundle's own library path goes.
    del base["LD_LIBRARY_PATH_ORIG"]
    plan = build_launch(spec, base_env=base, frozen=True, bundle_dir=str(bundle))
    assert "LD_LIBRARY_PATH" not in plan.env


def test_the_runner_folder_of_a_frozen_build_is_inside_the_bundle(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert default_runner_dir() == tmp_path / "trayapp" / "runner"


# ---------------------------------------------------------------------------------------------
# The dry-run text


def test_format_plan_shows_the_command_variables_reasons_and_tensorflow_calls(tmp_path):
    script = tmp_path / "my project" / "train.py"
    script.parent.mkdir()
    script.write_text("")
    plan = plan_for(
        script,
        base=dict(BASE, TF_MEMORY_ALLOCATION="0.8", TF_GPU_ALLOCATOR="cuda_malloc_async"),
        options=MemoryOptions(
            gpus=(0,), vram_limit_mb=4096, allocator="bfc", precision="mixed_float16", xla=True
        ),
        gpus=(gpu(0),),
        args=("--epochs", "3"),
    )
    text = format_plan(plan)
    assert f"'{script}' --epochs 3" in text  # shell-quoted
    assert "CUDA_VISIBLE_DEVICES=0" in text
    assert "--gpu 0: TensorFlow sees only these" in text
    assert "unset TF_GPU_ALLOCATOR" in text
    assert "PYTHONUNBUFFERED=1" in text
    assert "capped at 4096 MiB" in text
    assert "LogicalDeviceConfiguration(memory_limit=4096)" in text
    assert "keras.config.set_dtype_policy('mixed_float16')" in text
    assert "tf.config.optimizer.set_jit('autoclustering')" in text
    assert "Warnings:" in text and "TensorFlow does not read TF_MEMORY_ALLOCATION" in text


def test_the_probe_before_the_first_step_is_on_unless_turned_off() -> None:
    import argparse

    from trayapp.jobs.options import spec_from_cli
    from trayapp.jobs.spec_values import add_run_arguments

    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    assert spec_from_cli(parser.parse_args(["train.py"])).fit_batch is True
    assert spec_from_cli(parser.parse_args(["--fit-batch", "train.py"])).fit_batch is True
    assert spec_from_cli(parser.parse_args(["--no-fit-batch", "train.py"])).fit_batch is False
    assert JobSpec(script="t.py").fit_batch is True
    assert JobSpec.from_json({"script": "t.py"}).fit_batch is True
    assert JobSpec.from_json({"script": "t.py", "fit_batch": False}).fit_batch is False
