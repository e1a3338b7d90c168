"""The kernel spec ``headroom kernel install`` writes: the kernel.json contract, the options made by
the code that plans ``headroom run`` from the same flags, Jupyter's folders as jupyter_core finds
them, and the spec files (written, replaced, read back when corrupt, removed)."""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List

import pytest

from trayapp.cli.parser import build_parser
from trayapp.jobs import kernelspec as ks
from trayapp.jobs.options import JobSpec, SpecError, spec_from_cli
from trayapp.jobs.plan import JobProcess, build_launch, default_runner_dir
from trayapp.readings import GpuReading
from trayapp.runner import protocol

MIB = 1024 * 1024
PYTHON = sys.executable


def _gpu(index: int = 0, total_mb: int = 8192, display: bool = False) -> GpuReading:
    return GpuReading(index=index, name="Test GPU", uuid=f"GPU-{index:04d}",
                      memory_total_bytes=total_mb * MIB, memory_used_bytes=0,
                      memory_free_bytes=total_mb * MIB, display_active=display)


def _kernel_spec(*flags: str) -> JobSpec:
    args = build_parser().parse_args(["kernel", "install", "--python", PYTHON, *flags])
    return ks.spec_from_args(args)


def _run_spec(*flags: str) -> JobSpec:
    args = build_parser().parse_args(["run", "--python", PYTHON, *flags, "train.py"])
    return spec_from_cli(args)


def _env(data: Dict[str, Any]) -> Dict[str, str]:
    env = data["env"]
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    return env


def test_kernel_json_is_the_interface() -> None:
    spec = _kernel_spec("--preset", "desktop-safe", "--checkpoint-dir", "/tmp/ck",
                        "--vram-budget", "3000", "--on-oom", "stop")
    data = ks.kernel_json(spec, "headroom-desktop-safe", ram_total_bytes=16 * 1024 * MIB,
                          environ={})
    runner = str(default_runner_dir())
    assert data["argv"] == [PYTHON, os.path.join(runner, "bootstrap.py"), "--kernel", "-f",
                            "{connection_file}"]
    assert data["display_name"] == "Python 3 (Headroom: desktop-safe)"
    assert data["language"] == "python" and data["interrupt_mode"] == "signal"
    env = _env(data)
    assert "HEADROOM_HOME" not in env  # not set at install time: not handed on
    kernel = json.loads(env["HEADROOM_KERNEL"])
    assert kernel["v"] == 1 and kernel["name"] == "headroom-desktop-safe"
    engine_spec = kernel["spec"]
    assert not {"script", "args", "cwd", "env"} & set(engine_spec)
    # The preset is applied as the engine applies it to a script: a RAM budget of 75% of RAM.
    assert engine_spec["ram_budget_mb"] == 12288 and engine_spec["vram_budget_mb"] == 3000
    assert engine_spec["checkpoint_dir"] == "/tmp/ck" and engine_spec["on_oom"] == "stop"
    assert engine_spec["preset"] == "desktop-safe" and engine_spec["python"] == PYTHON
    JobSpec.from_json({**engine_spec, "script": "x"})  # the engine reads it as a job spec
    assert json.loads(env[protocol.ENV_PROCESS]) == JobProcess().to_json()
    assert data["metadata"] == {"headroom": {
        "v": 1, "python": PYTHON, "runner": runner,
        "options": ["--preset", "desktop-safe", "--vram-budget", "3000", "--checkpoint-dir",
                    "/tmp/ck", "--on-oom", "stop"]}}
    json.dumps(data)  # all of it JSON


@pytest.mark.parametrize("flags", [
    (),
    ("--preset", "desktop-safe"),
    ("--preset", "throughput"),
    ("--cpu-only", "--threads", "2,1", "--precision", "mixed_bfloat16"),
    ("--gpu", "1", "--vram-reserve", "1024", "--allocator", "cuda_malloc_async", "--no-xla"),
    ("--vram-limit", "2 GiB", "--min-batch", "4", "--fit-batch", "--on-oom", "smaller-batch"),
    ("--no-fit-batch",),
])
def test_options_are_those_headroom_run_plans_from_the_same_flags(flags: tuple) -> None:
    gpus = [_gpu(0, display=True), _gpu(1, total_mb=16384)]
    data = ks.kernel_json(_kernel_spec(*flags), "k", gpus=gpus, environ={})
    run = build_launch(_run_spec(*flags), gpus=gpus, base_env={})
    env = _env(data)
    assert json.loads(env[protocol.ENV_OPTIONS]) == run.runner_options
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TF_FORCE_GPU_ALLOW_GROWTH",
                 "TF_GPU_ALLOCATOR"):
        assert env.get(name) == run.env.get(name), name
    # The job channel is the engine's to give when it adopts the kernel.
    assert not {protocol.ENV_JOB_ID, protocol.ENV_ADDRESS, protocol.ENV_KEYFILE} & set(env)


def test_desktop_safe_on_a_display_gpu_leaves_1024_mb_free() -> None:
    data = ks.kernel_json(_kernel_spec("--preset", "desktop-safe"), "k",
                          gpus=[_gpu(0, total_mb=8192, display=True)], environ={})
    options = json.loads(_env(data)[protocol.ENV_OPTIONS])
    assert options["vram_limit_mb"] == [8192 - 1024] and options["memory_growth"] is None


def test_cpu_only_hides_the_gpus_and_env_entries_reach_the_kernel_only() -> None:
    spec = _kernel_spec("--cpu-only", "--env", "TOKEN=s3cret", "--env", "A=b")
    data = ks.kernel_json(spec, "k", environ={"HEADROOM_HOME": "rel/home"})
    env = _env(data)
    assert env["CUDA_VISIBLE_DEVICES"] == "-1"
    assert env["TOKEN"] == "s3cret" and env["A"] == "b"
    assert env["HEADROOM_HOME"] == os.path.abspath("rel/home")
    assert "s3cret" not in env["HEADROOM_KERNEL"]  # the engine never gets an --env value
    assert "s3cret" not in json.dumps(data["metadata"])
    assert data["display_name"] == "Python 3 (Headroom: custom)"


def test_display_name_and_names() -> None:
    data = ks.kernel_json(_kernel_spec(), "k", display_name="TF on the GPU", environ={})
    assert data["display_name"] == "TF on the GPU"
    assert ks.default_name("throughput") == "headroom-throughput"
    assert ks.default_name(None) == "headroom"
    assert ks.check_name("Headroom-Fast_1.0") == "headroom-fast_1.0"
    for bad in ("", "a b", "../x", "a/b", "é"):
        with pytest.raises(ks.KernelSpecError):
            ks.check_name(bad)


def test_spec_flags_read_back_give_the_same_spec() -> None:
    flags = ["--preset", "throughput", "--gpu", "0,1", "--no-memory-growth", "--vram-limit",
             "4096", "--precision", "float32", "--xla", "--threads", "4,2", "--ram-budget",
             "9000", "--checkpoint-dir", "/tmp/ck", "--checkpoint-every", "50",
             "--min-batch", "2", "--manual-resume", "--on-oom", "stop", "--no-fit-batch"]
    spec = _kernel_spec(*flags)
    assert ks.spec_flags(spec) == flags
    assert _kernel_spec(*ks.spec_flags(spec)) == spec


def test_bad_values_are_refused_naming_the_flag(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="--vram-limit"):
        _kernel_spec("--vram-limit", "lots")
    with pytest.raises(SpecError, match="--memory-growth"):
        ks.check_spec(_kernel_spec("--memory-growth", "--vram-limit", "100"))
    with pytest.raises(SpecError, match="not found"):
        ks.check_spec(replace(_kernel_spec(), python=str(tmp_path / "nope")))
    with pytest.raises(SpecError, match="not executable"):
        ks.check_spec(replace(_kernel_spec(), python=str(tmp_path)))
    # A checkpoint folder that holds a checkpoint is fine: a notebook resumes from it.
    (tmp_path / "ck" / "fit-1").mkdir(parents=True)
    (tmp_path / "ck" / "fit-1" / "x").write_text("")
    assert ks.check_spec(_kernel_spec("--checkpoint-dir", str(tmp_path / "ck"))) == []


# ---------------------------------------------------------------------------------------------
# Jupyter's folders


@pytest.mark.parametrize("env", [
    {"JUPYTER_DATA_DIR": "/somewhere/jd"},
    {"XDG_DATA_HOME": "/xdg"},
    {},
    {"JUPYTER_PREFER_ENV_PATH": "n", "JUPYTER_PATH": "/a" + os.pathsep + "/b/"},
    {"JUPYTER_PREFER_ENV_PATH": "y"},
    {"JUPYTER_PLATFORM_DIRS": "1"},
])
def test_the_data_folder_is_the_one_jupyter_core_finds(env: Dict[str, str], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_core import paths as jpaths

    for name in ("JUPYTER_DATA_DIR", "XDG_DATA_HOME", "JUPYTER_PLATFORM_DIRS", "JUPYTER_PATH",
                 "JUPYTER_PREFER_ENV_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert str(ks.jupyter_data_dir()) == jpaths.jupyter_data_dir()
    assert [str(p) for p in ks.search_dirs()] == jpaths.jupyter_path("kernels")


def test_the_data_folder_on_each_platform(tmp_path: Path) -> None:
    home = os.path.realpath(os.path.expanduser("~"))
    assert ks.jupyter_data_dir({}, "darwin") == Path(home, "Library", "Jupyter")
    assert ks.jupyter_data_dir({"APPDATA": r"C:\Users\u\AppData\Roaming"}, "win32") == \
        Path(r"C:\Users\u\AppData\Roaming", "jupyter")
    assert ks.jupyter_data_dir({}, "win32") == Path(home, ".jupyter", "data")
    assert ks.jupyter_data_dir({}, "linux") == Path(home, ".local", "share", "jupyter")
    assert ks.jupyter_data_dir({"XDG_DATA_HOME": "/x"}, "linux") == Path("/x/jupyter")
    assert ks.jupyter_data_dir({"JUPYTER_DATA_DIR": "/j"}, "win32") == Path("/j")
    assert ks.prefix_kernels_dir(str(tmp_path)) == tmp_path / "share" / "jupyter" / "kernels"


# ---------------------------------------------------------------------------------------------
# Spec files


def _data(name: str = "k") -> Dict[str, Any]:
    return ks.kernel_json(_kernel_spec(), name, environ={})


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")
def test_install_is_private_in_the_users_folder_and_readable_in_a_prefix(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        mine = ks.install(_data(), "k", tmp_path / "user" / "kernels", private=True)
        shared = ks.install(_data(), "k", tmp_path / "env" / "share" / "jupyter" / "kernels",
                            private=False)
    finally:
        os.umask(old)
    assert (_mode(mine.path), _mode(mine.path.parent)) == (0o600, 0o700)
    assert _mode(tmp_path / "user" / "kernels") == 0o700
    assert (_mode(shared.path), _mode(shared.path.parent)) == (0o644, 0o755)
    assert _mode(tmp_path / "env" / "share") == 0o755
    assert json.loads(mine.path.read_text()) == _data()
    assert [p.name for p in mine.path.parent.iterdir()] == ["kernel.json"]  # no temporary left


def test_install_twice_replaces_and_another_kernels_spec_needs_replace(tmp_path: Path) -> None:
    first = ks.install(_data(), "k", tmp_path, private=True)
    assert first.replaced is None
    again = ks.install(ks.kernel_json(_kernel_spec("--cpu-only"), "k", environ={}), "K",
                       tmp_path, private=True)
    assert again.replaced is not None and again.replaced.headroom
    assert again.path == first.path
    assert json.loads(again.path.read_text())["env"]["CUDA_VISIBLE_DEVICES"] == "-1"

    other = tmp_path / "python3"
    other.mkdir()
    (other / "kernel.json").write_text(json.dumps({"argv": ["python", "-m", "ipykernel"],
                                                   "display_name": "Python 3"}))
    (other / "logo-64x64.png").write_bytes(b"png")
    with pytest.raises(ks.KernelSpecError, match="did not write.*--replace"):
        ks.install(_data(), "python3", tmp_path, private=True)
    assert "ipykernel" in (other / "kernel.json").read_text()
    done = ks.install(_data(), "python3", tmp_path, private=True, replace_other=True)
    assert done.replaced is not None and not done.replaced.headroom
    assert sorted(p.name for p in other.iterdir()) == ["kernel.json"]


CORRUPT: List[Any] = [
    b"{not json",
    b"\xff\xfe\x00binary",
    b"[1, 2, 3]",
    b"",
    b"[" * 100000 + b"]" * 100000,
    json.dumps({"argv": 5, "display_name": ["x"], "metadata": {"headroom": "yes"}}).encode(),
    json.dumps({"metadata": {"headroom": {"python": 5, "runner": None, "options": 7}}}).encode(),
    b" " * (ks.MAX_SPEC_BYTES + 1),
]


@pytest.mark.parametrize("content", CORRUPT)
def test_a_corrupt_kernel_json_is_an_entry_with_a_problem(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "kernel.json").write_bytes(content)
    [entry] = ks.list_kernels([tmp_path])
    assert entry.name == "bad" and entry.problem
    json.dumps(entry.to_json())


def test_a_fifo_or_a_folder_as_kernel_json_does_not_hang_the_listing(tmp_path: Path) -> None:
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "kernel.json")  # no writer: a blocking open would hang
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "kernel.json").mkdir()
    entries = {e.name: e for e in ks.list_kernels([tmp_path])}
    assert "not a regular file" in (entries["fifo"].problem or "")
    assert entries["dir"].problem


def test_listing_flags_broken_specs_and_skips_what_is_not_a_spec(tmp_path: Path) -> None:
    ks.install(_data(), "ok", tmp_path, private=True)
    gone = _data("gone-python")
    gone["metadata"]["headroom"]["python"] = str(tmp_path / "venv" / "bin" / "python")
    ks.install(gone, "gone-python", tmp_path, private=True)
    moved = _data("gone-runner")
    moved["metadata"]["headroom"]["runner"] = str(tmp_path / "old-headroom" / "runner")
    ks.install(moved, "gone-runner", tmp_path, private=True)
    (tmp_path / "empty").mkdir()
    (tmp_path / "a file").write_text("")
    (tmp_path / "not a name").mkdir()
    (tmp_path / "folder-spec" / "kernel.json").mkdir(parents=True)
    entries = {e.name: e for e in ks.list_kernels([tmp_path, tmp_path / "missing"])}
    assert sorted(entries) == ["empty", "folder-spec", "gone-python", "gone-runner", "ok"]
    assert entries["ok"].problem is None and entries["ok"].headroom
    assert "interpreter is gone" in (entries["gone-python"].problem or "")
    assert "runner is gone" in (entries["gone-runner"].problem or "")
    assert entries["empty"].problem and entries["folder-spec"].problem


def test_remove_takes_headrooms_specs_only(tmp_path: Path) -> None:
    ks.install(_data(), "mine", tmp_path / "a", private=True)
    ks.install(_data(), "mine", tmp_path / "b", private=True)
    (tmp_path / "a" / "theirs").mkdir()
    (tmp_path / "a" / "theirs" / "kernel.json").write_text('{"argv": ["python"]}')
    (tmp_path / "a" / "corrupt").mkdir()
    (tmp_path / "a" / "corrupt" / "kernel.json").write_text("{")
    dirs = [tmp_path / "a", tmp_path / "b"]
    assert ks.remove("MINE", dirs) == [tmp_path / "a" / "mine", tmp_path / "b" / "mine"]
    assert not (tmp_path / "a" / "mine").exists() and not (tmp_path / "b" / "mine").exists()
    with pytest.raises(ks.KernelSpecError, match="no Headroom kernel spec called 'mine'"):
        ks.remove("mine", dirs)
    with pytest.raises(ks.KernelSpecError, match="not a Headroom kernel spec"):
        ks.remove("theirs", dirs)
    with pytest.raises(ks.KernelSpecError, match="cannot be told"):
        ks.remove("corrupt", dirs)
    assert (tmp_path / "a" / "theirs" / "kernel.json").exists()
    assert (tmp_path / "a" / "corrupt" / "kernel.json").exists()


def test_install_into_a_folder_that_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ks.KernelSpecError, match="cannot write the kernel spec"):
        ks.install(_data(), "k", tmp_path / "file" / "kernels", private=True)
