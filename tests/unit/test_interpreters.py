"""Finding interpreters (venvs beside the script, conda, pyenv, PATH) and probing real ones."""

from __future__ import annotations

import json
import os
import platform
import stat
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from trayapp.jobs import interpreters
from trayapp.jobs.interpreters import (
    CACHE_FILE,
    Interpreter,
    default_python,
    discover,
    discover_with_sources,
    probe,
)


def make_env(prefix: Path, kind: str = "venv") -> Path:
    """An environment folder with an executable bin/python (a link to this Python)."""
    (prefix / "bin").mkdir(parents=True)
    if kind == "venv":
        (prefix / "pyvenv.cfg").write_text("home = /usr/bin\n")
    else:
        (prefix / "conda-meta").mkdir()
    python = prefix / "bin" / "python"
    python.symlink_to(sys.executable)
    return python


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# ---------------------------------------------------------------------------------------------
# Discovery


def test_discovery_looks_everywhere_people_keep_environments(tmp_path):
    project = tmp_path / "project"
    script = project / "src" / "train.py"
    script.parent.mkdir(parents=True)
    script.write_text("")
    beside = make_env(project / ".venv")  # one folder up from the script
    not_an_env = project / "env"  # a plain folder named env is not an environment
    not_an_env.mkdir()
    active = make_env(tmp_path / "miniconda" / "envs" / "active", "conda")
    listed = make_env(tmp_path / "miniconda" / "envs" / "tf", "conda")
    home = tmp_path / "home"
    (home / ".conda").mkdir(parents=True)
    (home / ".conda" / "environments.txt").write_text(
        f"{listed.parent.parent}\n{active.parent.parent}\n\n"
    )
    pyenv = make_env(tmp_path / "pyenv" / "versions" / "3.10.13")
    path_bin = tmp_path / "usr" / "bin"
    path_bin.mkdir(parents=True)
    (path_bin / "python3").symlink_to(sys.executable)
    environ = {
        "CONDA_PREFIX": str(active.parent.parent),
        "PYENV_ROOT": str(tmp_path / "pyenv"),
        "PATH": str(path_bin),
    }
    found = discover_with_sources(str(script), environ=environ, home=home, run_conda=False)
    assert found[0] == (str(beside), "venv")
    assert (sys.executable, "current") in found
    assert (str(active), "conda") in found and (str(listed), "conda") in found
    assert [p for p, s in found].count(str(active)) == 1  # active and listed: once
    assert (str(pyenv), "pyenv") in found
    assert (str(path_bin / "python3"), "path") in found
    assert not any(str(not_an_env) in p for p, _ in found)


def test_a_frozen_app_is_not_offered_as_a_python(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    found = discover_with_sources(None, environ={"PATH": ""}, home=tmp_path, run_conda=False)
    assert all(source != "current" for _, source in found)


def test_discover_returns_paths(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    python = make_env(tmp_path / "venv")
    paths = discover(str(script))
    assert paths[0] == str(python)
    assert all(isinstance(p, str) for p in paths)


def test_the_default_python_is_a_venv_beside_the_script(tmp_path):
    script = tmp_path / "proj" / "train.py"
    script.parent.mkdir()
    script.write_text("")
    assert default_python(str(script)) == sys.executable  # nothing beside it
    python = make_env(tmp_path / "proj" / "venv")
    assert default_python(str(script)) == str(python)


def test_a_frozen_app_defaults_to_python_on_path(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert default_python(str(tmp_path / "train.py")) == str(bin_dir / "python3")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert default_python(str(tmp_path / "train.py")) == "python3"


# ---------------------------------------------------------------------------------------------
# Probing real interpreters


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    return str(folder / "bin" / "python")


def test_probe_of_a_python_without_tensorflow(bare_python):
    found = probe(bare_python, source="venv")
    assert found.error is None
    assert found.python_version == platform.python_version()
    assert (found.tf_version, found.keras_version, found.gpus_seen) == (None, None, None)
    assert found.summary() == f"Python {sys.version_info[0]}.{sys.version_info[1]} · no TensorFlow"
    assert found.source == "venv"


@pytest.mark.tensorflow
def test_probe_of_a_python_with_tensorflow():
    found = probe(sys.executable, source="current")
    assert found.error is None
    tf_version = metadata.version("tensorflow-cpu")
    assert found.tf_version == tf_version
    assert found.keras_version == metadata.version("keras")
    assert found.is_cuda_build is False  # tensorflow-cpu
    assert found.gpus_seen == 0
    major_minor = ".".join(tf_version.split(".")[:2])
    assert found.summary() == (
        f"Python {sys.version_info[0]}.{sys.version_info[1]} · TensorFlow {major_minor} · "
        "CPU build · sees 0 GPUs"
    )


def test_probes_are_cached_until_the_environment_changes(tmp_path, bare_python):
    runs = tmp_path / "runs"
    prefix = tmp_path / "wrapped"
    site = prefix / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    python = executable(
        prefix / "bin" / "python", f'#!/bin/sh\necho run >> "{runs}"\nexec "{bare_python}" "$@"\n'
    )
    cache = tmp_path / "cache"
    first = probe(str(python), cache_dir=cache)
    second = probe(str(python), cache_dir=cache)
    assert first == second and first.error is None
    assert runs.read_text().count("run") == 1
    assert str(python) in json.loads((cache / CACHE_FILE).read_text())
    (site / "tensorflow-9.9.dist-info").mkdir()  # something was installed
    probe(str(python), cache_dir=cache)
    assert runs.read_text().count("run") == 2


@pytest.mark.parametrize(
    "body, timeout, error",
    [
        ('echo "boom: no such module" >&2\nexit 3\n', 30, "exit status 3: boom: no such module"),
        ("exec sleep 30\n", 0.5, "no answer within 0.5 s"),
        ("echo just talking\n", 30, "not a working Python (exit status 0"),
    ],
)
def test_a_bad_interpreter_is_an_error_not_an_exception(tmp_path, body, timeout, error):
    python = executable(tmp_path / "bin" / "python", "#!/bin/sh\n" + body)
    found = probe(str(python), cache_dir=tmp_path / "cache", timeout=timeout)
    assert error in (found.error or "")
    assert found.python_version is None
    assert found.summary().startswith(str(python))
    assert not (tmp_path / "cache" / CACHE_FILE).exists()  # failures are not cached


def test_a_missing_or_non_executable_interpreter(tmp_path):
    assert probe(str(tmp_path / "nothing")).error == "not found"
    text = tmp_path / "python"
    text.write_text("")
    assert "cannot run it" in (probe(str(text)).error or "")


def answering(tmp_path: Path, answer: dict) -> str:
    line = "HEADROOM_PROBE " + json.dumps(answer)
    return str(executable(tmp_path / "bin" / "python", f"#!/bin/sh\necho '{line}'\n"))


def test_an_old_python_is_reported_as_too_old(tmp_path):
    found = probe(answering(tmp_path, {"python_version": "2.7.18"}))
    assert found.error == "Python 2.7 is too old for Headroom's runner (3.9 or newer)"


def test_a_tensorflow_that_does_not_import_is_reported(tmp_path):
    answer = {
        "python_version": "3.10.4",
        "tf_version": "2.15.0",
        "error": "TensorFlow does not import: libcudart.so.12: cannot open shared object file",
    }
    found = probe(answering(tmp_path, answer))
    assert found.tf_version == "2.15.0"
    assert "libcudart.so.12" in found.summary()


@pytest.mark.parametrize(
    "interp, text",
    [
        (
            Interpreter("p", "3.10.12", "2.15.1", "2.15.0", True, "12.2", "8.9", 1),
            "Python 3.10 · TensorFlow 2.15 · CUDA 12.2 build · sees 1 GPU",
        ),
        (
            Interpreter("p", "3.12.1", "2.17.0", None, True, None, None, 2),
            "Python 3.12 · TensorFlow 2.17 · CUDA build · sees 2 GPUs",
        ),
        (Interpreter("p", "3.9.0", "2.13.0", is_cuda_build=None), "Python 3.9 · TensorFlow 2.13"),
        (Interpreter("/x/python", error="not found"), "/x/python: not found"),
    ],
)
def test_summary(interp, text):
    assert interp.summary() == text


def test_to_json_has_every_field():
    data = Interpreter("p", "3.11.2").to_json()
    assert set(data) == {
        "path",
        "python_version",
        "tf_version",
        "keras_version",
        "is_cuda_build",
        "cuda_version",
        "cudnn_version",
        "gpus_seen",
        "error",
        "source",
    }


def test_the_probe_runs_without_headroom_on_its_path(tmp_path, bare_python):
    """The probe gets the job's environment: Headroom's PYTHONPATH does not reach it."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(interpreters.__file__)))
    headroom_root = os.path.dirname(package)  # the folder holding trayapp/
    env = dict(os.environ, PYTHONPATH=headroom_root)
    env_seen = tmp_path / "seen"
    python = executable(
        tmp_path / "bin" / "python",
        f'#!/bin/sh\necho "$PYTHONPATH" > "{env_seen}"\nexec "{bare_python}" "$@"\n',
    )
    probe(str(python), env=env)
    assert headroom_root not in env_seen.read_text()


def test_the_probe_script_needs_nothing_but_the_python_it_runs_in(tmp_path, bare_python):
    """The probe runs in the user's Python, which has no Headroom: run from a folder without
    trayapp/ beside it (``-c`` puts the working folder on the path), it still answers."""
    done = subprocess.run([bare_python, "-c", interpreters.PROBE_SCRIPT], cwd=tmp_path,
                          env={"PATH": os.environ.get("PATH", "")}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "HEADROOM_PROBE " in done.stdout
