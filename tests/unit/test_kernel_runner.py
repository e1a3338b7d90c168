"""The runner's kernel mode without a kernel: where it finds the engine, how it names itself,
how a fit in a notebook is matched to its checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from trayapp.config import get_paths
from trayapp.runner import engine_home
from trayapp.runner.kernel import fit_fingerprint, kernel_name, parse_adopted


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
    assert kernel_name({}, "/r/kernel-1.json") == "kernel-1"


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
