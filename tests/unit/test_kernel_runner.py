"""The runner's kernel mode without a kernel: where it finds the engine, how it names itself,
how a fit in a notebook is matched to its checkpoint."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from trayapp.config import get_paths
from trayapp.runner import engine_home
from trayapp.runner.kernel import fit_fingerprint, kernel_name, parse_adopted, when_kernel_up


@pytest.mark.parametrize("sub", ["h", "a/../h", "x" * 90])
def test_the_runner_finds_the_engine_where_headroom_keeps_it(tmp_path: Path, sub: str,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.setenv("HEADROOM_HOME", str(tmp_path / sub))
    paths = get_paths()
    assert engine_home.control() == (paths.control_address, str(paths.key_file))


def test_without_headroom_home_the_platform_folder(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEADROOM_HOME", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert engine_home.data_dir() == str(get_paths().data_dir)


def test_a_kernel_is_named_after_its_notebook() -> None:
    assert kernel_name({"JPY_SESSION_NAME": "/w/a b/train.ipynb"}, "/r/kernel-1.json") == \
        "train.ipynb"
    # Started by jupyter_client or nbconvert (a temporary connection file, no session name):
    # the kernel spec's display name and the time it started.
    at = time.mktime((2026, 12, 2, 14, 5, 0, 0, 0, -1))
    spec = json.dumps({"v": 1, "name": "headroom", "display_name": "Python 3 (Headroom)"})
    assert kernel_name({"HEADROOM_KERNEL": spec}, "/tmp/tmprem_e3j6.json", now=at) == \
        "Python 3 (Headroom) 14:05"
    assert kernel_name({"HEADROOM_KERNEL": json.dumps({"name": "gpu-safe"})}, "", now=at) == \
        "gpu-safe 14:05"
    assert kernel_name({"HEADROOM_KERNEL": "not json"}, "/r/kernel-1.json", now=at) == \
        "kernel 14:05"
    long = json.dumps({"display_name": "x" * 500})
    assert len(kernel_name({"HEADROOM_KERNEL": long}, "", now=at)) <= 200


def test_an_answer_that_is_not_one_is_not_taken() -> None:
    good = {"job": "ab12", "address": "/r/job-ab12.sock", "key": "00ff"}
    assert parse_adopted(good) == ("ab12", "/r/job-ab12.sock", b"\x00\xff")
    for bad in (None, [], {**good, "job": "../x"}, {**good, "key": "zz"}, {**good, "address": 3},
                {**good, "key": "0" * 2000}):
        assert parse_adopted(bad) is None


def test_the_same_fit_of_a_model_made_again_has_the_same_fingerprint() -> None:
    keras = pytest.importorskip("keras")
    import numpy as np

    def make(units: int = 4) -> object:
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units)])
        m.compile(optimizer="adam", loss="mse")
        return m

    x = np.zeros((10, 3), "float32")
    args = {"x": x, "y": x[:, :1], "epochs": 3, "batch_size": 2}
    first = fit_fingerprint(make(), args)
    assert fit_fingerprint(make(), args) == first  # new layer names, same fit
    assert fit_fingerprint(make(5), args) != first
    assert fit_fingerprint(make(), {**args, "epochs": 4}) != first
    assert fit_fingerprint(make(), {**args, "x": np.zeros((12, 3), "float32")}) != first


def test_registering_waits_for_ipykernel_to_serve() -> None:
    import threading
    import types

    calls: list = []

    class App:
        def start(self, *args: object) -> None:
            calls.append((up.is_set(), args))

    up = threading.Event()
    when_kernel_up(types.SimpleNamespace(IPKernelApp=App), up)
    assert not up.is_set()
    App().start(1)
    assert up.is_set() and calls == [(True, (1,))]
    other = threading.Event()
    when_kernel_up(types.SimpleNamespace(), other)  # an ipykernel it cannot read: at once
    assert other.is_set()


def test_a_kernel_loads_only_what_it_needs_before_ipykernel(tmp_path: Path) -> None:
    """Kernel mode reaches ``ipykernel_launcher`` without the fit hook, the checkpoint code or
    the registering's sockets (they load when used)."""
    import json
    import subprocess
    import sys

    (tmp_path / "ipykernel_launcher.py").write_text(
        "import json, sys\n"
        "print(json.dumps([m for m in sys.modules if m.startswith('_headroom_runner')"
        " or m in ('socket', 'tempfile', 'hashlib', 'multiprocessing.connection')]))\n")
    bootstrap = Path(engine_home.__file__).with_name("bootstrap.py")
    home = tmp_path / "home"
    done = subprocess.run([sys.executable, str(bootstrap), "--kernel", "-f", "c.json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={"HEADROOM_HOME": str(home), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "_headroom_runner.kernel" in loaded and "_headroom_runner.job" in loaded
    early = {"_headroom_runner.fithook", "_headroom_runner.training", "socket", "tempfile",
             "hashlib", "multiprocessing.connection"} & loaded
    assert not early, early
