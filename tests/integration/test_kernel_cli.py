"""``headroom kernel install | list | remove`` as a user runs them (real processes of the real CLI),
checked against jupyter_client's own KernelSpecManager: an interpreter without ipykernel, a spec
installed twice and removed, ``--prefix`` and ``--sys-prefix``, corrupt kernel.json files, bad
input; and no module of Jupyter loaded by Headroom."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from tests.conftest import REPO, run_cli

FIND = """
import json
from jupyter_client.kernelspec import KernelSpecManager
m, out = KernelSpecManager(), {}
for name, folder in m.find_kernel_specs().items():
    try:
        spec = m.get_kernel_spec(name)
    except Exception:  # a corrupt spec of the test's: Jupyter lists it, cannot read it
        continue
    out[name] = [folder, spec.argv, spec.display_name]
print(json.dumps(out))
"""


def _venv(where: Path, with_ipykernel: bool) -> Path:
    """A venv without pip at ``where``; ``with_ipykernel``: it sees this Python's packages (a
    .pth file), so it imports ipykernel and jupyter_client while its sys.prefix is its own."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True,
                   timeout=120, capture_output=True)
    python = where / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if with_ipykernel:
        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True, timeout=60).stdout.strip()
        import ipykernel

        outer = str(Path(ipykernel.__file__).resolve().parent.parent)
        Path(purelib, "outer.pth").write_text(outer + "\n")
    return python


class Env:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.data = tmp / "jupyter-data"
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("JUPYTER_PATH", "JUPYTER_PLATFORM_DIRS", "JUPYTER_CONFIG_DIR")}
        self.env.update({"JUPYTER_DATA_DIR": str(self.data), "HEADROOM_HOME": str(tmp / "home"),
                         "PYTHONPATH": str(REPO)})
        self.kernel_python = _venv(tmp / "kernel-venv", with_ipykernel=True)
        self.bare_python = _venv(tmp / "bare-venv", with_ipykernel=False)

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        r = run_cli(*args, env={**self.env, **env}, timeout=120)
        assert "Traceback" not in r.stderr + r.stdout, r.stderr
        return r

    def found(self, python: str = sys.executable, **env: str) -> Dict[str, List[Any]]:
        """What jupyter_client finds, run by ``python`` in the same environment."""
        r = subprocess.run([python, "-c", FIND], env={**self.env, **env}, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def e(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    yield Env(tmp_path_factory.mktemp("kernels"))


def _one_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_an_interpreter_without_ipykernel_is_refused_in_one_line(e: Env) -> None:
    r = e.cli("kernel", "install", "--python", str(e.bare_python), "--name", "bare")
    assert r.returncode == 2
    line = _one_line(r)
    assert "no ipykernel" in line and f"{e.bare_python} -m pip install ipykernel" in line
    assert not (e.data / "kernels" / "bare").exists()


def test_installed_twice_found_by_jupyter_then_removed(e: Env) -> None:
    py = str(e.kernel_python)
    r = e.cli("kernel", "install", "--python", py, "--preset", "desktop-safe")
    assert r.returncode == 0, r.stderr
    folder = e.data / "kernels" / "headroom-desktop-safe"
    assert r.stdout.startswith(f"Installed the kernel spec headroom-desktop-safe in {folder}")
    found = e.found()
    assert found["headroom-desktop-safe"][0] == str(folder)
    argv = found["headroom-desktop-safe"][1]
    assert argv[0] == py and argv[1].endswith("bootstrap.py") and argv[2:] == [
        "--kernel", "-f", "{connection_file}"]
    assert found["headroom-desktop-safe"][2] == "Python 3 (Headroom: desktop-safe)"

    r = e.cli("kernel", "install", "--python", py, "--preset", "desktop-safe", "--cpu-only",
              "--display-name", "CPU notebook")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Replaced the kernel spec headroom-desktop-safe")
    spec = json.loads((folder / "kernel.json").read_text())
    assert spec["env"]["CUDA_VISIBLE_DEVICES"] == "-1"
    assert e.found()["headroom-desktop-safe"][2] == "CPU notebook"
    assert [p.name for p in folder.iterdir()] == ["kernel.json"]

    listed = json.loads(e.cli("kernel", "list", "--json").stdout)["kernels"]
    mine = [k for k in listed if k["name"] == "headroom-desktop-safe"]
    assert mine and mine[0]["python"] == py and mine[0]["problem"] is None
    assert mine[0]["options"] == ["--preset", "desktop-safe", "--cpu-only"]
    table = e.cli("kernel", "list").stdout
    assert "headroom-desktop-safe" in table and "CPU notebook" in table and py in table

    r = e.cli("kernel", "remove", "headroom-desktop-safe")
    assert r.returncode == 0 and "Removed the kernel spec headroom-desktop-safe" in r.stdout
    assert "headroom-desktop-safe" not in e.found() and not folder.exists()
    r = e.cli("kernel", "remove", "headroom-desktop-safe")
    assert r.returncode == 2 and "no Headroom kernel spec" in _one_line(r)


def test_prefix_and_sys_prefix(e: Env) -> None:
    py = str(e.kernel_python)
    prefix = e.tmp / "prefix"
    r = e.cli("kernel", "install", "--python", py, "--prefix", str(prefix), "--name", "in-prefix")
    assert r.returncode == 0, r.stderr
    folder = prefix / "share" / "jupyter" / "kernels" / "in-prefix"
    assert (folder / "kernel.json").is_file()
    assert "in-prefix" not in e.found()  # not a folder Jupyter searches by itself
    found = e.found(JUPYTER_PATH=str(prefix / "share" / "jupyter"))
    assert found["in-prefix"][0] == str(folder)
    assert "in-prefix" in e.cli("kernel", "list", "--prefix", str(prefix)).stdout

    r = e.cli("kernel", "install", "--python", py, "--sys-prefix", "--name", "in-env")
    assert r.returncode == 0, r.stderr
    venv = e.tmp / "kernel-venv"
    assert (venv / "share" / "jupyter" / "kernels" / "in-env" / "kernel.json").is_file()
    # The Jupyter of that environment finds it.
    assert e.found(python=py)["in-env"][0] == str(venv / "share" / "jupyter" / "kernels" /
                                                 "in-env")
    r = e.cli("kernel", "remove", "in-env", "--sys-prefix", "--python", py)
    assert r.returncode == 0, r.stderr
    assert "in-env" not in e.found(python=py)
    r = e.cli("kernel", "install", "--python", str(e.bare_python), "--sys-prefix")
    assert r.returncode == 2 and "no ipykernel" in _one_line(r)


def test_corrupt_and_broken_specs_are_shown_not_fatal(e: Env) -> None:
    kernels = e.data / "kernels"
    for name, content in (("garbage", b"{\x00\xff"), ("array", b"[]"),
                          ("deep", b"[" * 50000 + b"]" * 50000)):
        (kernels / name).mkdir(parents=True)
        (kernels / name / "kernel.json").write_bytes(content)
    gone = _venv(e.tmp / "gone-venv", with_ipykernel=True)
    r = e.cli("kernel", "install", "--python", str(gone), "--name", "gone")
    assert r.returncode == 0, r.stderr
    shutil.rmtree(e.tmp / "gone-venv")
    r = e.cli("kernel", "list")
    assert r.returncode == 0, r.stderr
    for name in ("garbage", "array", "deep", "gone"):
        assert name in r.stdout
    assert r.stdout.count("! broken:") >= 4 and "interpreter is gone" in r.stdout
    listed = {k["name"]: k for k in json.loads(e.cli("kernel", "list", "--json").stdout)
              ["kernels"]}
    assert listed["garbage"]["problem"] and listed["gone"]["headroom"]
    r = e.cli("kernel", "remove", "garbage")
    assert r.returncode == 2 and "cannot be told" in _one_line(r)
    assert e.cli("kernel", "remove", "gone").returncode == 0
    # Jupyter itself still lists the others, and Headroom's install over a corrupt one works.
    r = e.cli("kernel", "install", "--python", str(e.kernel_python), "--name", "garbage")
    assert r.returncode == 0 and "the one before was broken" in r.stdout
    assert "garbage" in e.found()
    for name in ("garbage", "array", "deep"):
        shutil.rmtree(kernels / name)


@pytest.mark.parametrize("args, expected", [
    (["kernel"], "install, list or remove"),
    (["kernel", "install", "--vram-limt", "4"], "did you mean --vram-limit"),
    (["kernel", "install", "--resume"], "unrecognized arguments: --resume"),
    (["kernel", "install", "--python", "/no/such/python"], "--python: not found"),
    (["kernel", "install", "--name", "my kernel"], "not a kernel name"),
    (["kernel", "install", "--memory-growth", "--vram-limit", "100"], "cannot be combined"),
    (["kernel", "install", "--prefix", "P", "--sys-prefix"], "not allowed with"),
    (["kernel", "remove"], "NAME"),
])
def test_bad_usage_is_one_line(e: Env, args: List[str], expected: str) -> None:
    r = e.cli(*args)
    assert r.returncode == 2
    assert expected in _one_line(r)


def test_an_unwritable_folder_and_a_python_that_is_not_one(e: Env) -> None:
    blocker = e.tmp / "a-file"
    blocker.write_text("")
    r = e.cli("kernel", "install", "--python", str(e.kernel_python),
              JUPYTER_DATA_DIR=str(blocker / "jupyter"))
    assert r.returncode == 2 and "cannot write the kernel spec" in _one_line(r)
    r = e.cli("kernel", "install", "--python", str(blocker))
    assert r.returncode == 2 and "not executable" in _one_line(r)
    script = e.tmp / "fake-python"
    script.write_text("#!/bin/sh\nexit 3\n")
    script.chmod(0o755)
    r = e.cli("kernel", "install", "--python", str(script))
    assert r.returncode == 2 and "no ipykernel" in _one_line(r)


PROBE = """
import contextlib, io, json, sys
from trayapp.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
print(json.dumps([code, sorted(m for m in sys.modules if m.startswith(
    ("jupyter", "ipykernel", "zmq", "PySide6", "trayapp.engine.service")))]))
"""


def test_headroom_loads_nothing_of_jupyter(e: Env) -> None:
    for args in (["kernel", "install", "--python", str(e.kernel_python), "--dry-run"],
                 ["kernel", "list"]):
        r = subprocess.run([sys.executable, "-c", PROBE, *args], env=e.env, capture_output=True,
                           text=True, timeout=120, cwd=str(REPO))
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout.strip().splitlines()[-1]) == [0, []]
