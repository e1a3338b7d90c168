"""Settings: the table of defaults, messages for bad keys and values, saving without loss; and
config files made at random, which must give defaults and messages, never an exception."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trayapp import config as cfg
from trayapp.config import ConfigError, Threshold, parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def test_defaults_file_parses_and_matches_the_table(tmp_path: Path) -> None:
    text = cfg.default_text()
    data = tomllib.loads(text)
    loaded = cfg.from_mapping(data)
    assert loaded.problems == []
    for s in cfg.SETTINGS:
        assert loaded[s.name] == s.default
        assert s.comment.split("...")[0][:30] in text  # every default is commented


@pytest.mark.parametrize("text,expected", [
    ("2048 MiB", 2048 * 2**20), ("2 GiB", 2 * 2**30), ("1.5G", int(1.5 * 2**30)),
    ("500 MB", 500 * 10**6), ("123", 123), (4096, 4096),
])
def test_sizes(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["lots", "-5 MiB", "2 parsecs", "", True, -1, "1e9 MiB"])
def test_bad_sizes(bad: object) -> None:
    with pytest.raises(ConfigError):
        parse_size(bad)


def test_thresholds_as_share_or_size() -> None:
    assert Threshold.parse("15%").bytes_of(1000) == 150
    assert Threshold.parse("2 GiB").bytes_of(1) == 2 * 2**30
    with pytest.raises(ConfigError, match="between 0% and 100%"):
        Threshold.parse("150%")
    with pytest.raises(ConfigError, match="percentage"):
        Threshold.parse("a lot")


def test_bad_key_and_value_are_named_and_defaulted() -> None:
    c = cfg.from_mapping({"guard": {"warn_available": "lots", "mystery": 1, "mode": "wild"},
                          "engine": {"sample_interval": 0.0001}, "colours": {}})
    text = "\n".join(c.problems)
    assert "guard.warn_available" in text and "15%" in text
    assert "unknown setting guard.mystery" in text
    assert "guard.mode" in text and "not one of" in text
    assert "engine.sample_interval" in text and "minimum" in text
    assert "unknown section [colours]" in text
    assert c["guard.warn_available"] == "15%" and c["guard.mode"] == "act"
    assert c["engine.sample_interval"] == 1.0


def test_unreadable_file_gives_defaults(tmp_path: Path) -> None:
    p = tmp_path / "config.toml"
    p.write_bytes(b"\xff\xfe[guard\nmode = ")
    c = cfg.load(p)
    assert c["guard.mode"] == "act"
    assert len(c.problems) == 1 and "cannot be read" in c.problems[0]


def test_save_keeps_comments_and_other_keys(tmp_path: Path) -> None:
    p = tmp_path / "config.toml"
    p.write_text("# mine\n[guard]\nwarn_available = \"3 GiB\"  # my machine\n"
                 "[ui]\nnotifications = false\n")
    assert cfg.save_value(p, "guard.mode", "dry-run") == "dry-run"
    text = p.read_text()
    assert "# mine" in text and "# my machine" in text and "notifications = false" in text
    loaded = cfg.load(p)
    assert loaded["guard.mode"] == "dry-run" and loaded["guard.warn_available"] == "3 GiB"
    assert loaded.problems == []


def test_save_refuses_bad_values_and_writes_nothing(tmp_path: Path) -> None:
    p = tmp_path / "config.toml"
    p.write_text("[guard]\nmode = \"off\"\n")
    before = p.read_text()
    with pytest.raises(ConfigError):
        cfg.save_value(p, "guard.pause_available", "half")
    with pytest.raises(ConfigError, match="unknown setting"):
        cfg.save_value(p, "guard.whatever", 1)
    assert p.read_text() == before


def test_save_over_a_broken_file_keeps_it_aside(tmp_path: Path) -> None:
    p = tmp_path / "config.toml"
    p.write_text("[guard\nthis is not toml")
    cfg.save_value(p, "ui.notifications", False)
    aside = [q for q in tmp_path.iterdir() if q.name.startswith("config.toml.broken-")]
    assert len(aside) == 1 and "this is not toml" in aside[0].read_text()
    assert cfg.load(p)["ui.notifications"] is False


def test_paths_use_a_short_runtime_folder_when_home_is_deep(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    monkeypatch.setenv("HEADROOM_HOME", str(deep))
    paths = cfg.get_paths()
    assert len(paths.job_address("0123456789ab")) <= 100
    paths.ensure()
    assert (paths.runtime_dir.stat().st_mode & 0o777) == 0o700


toml_scalars = (st.booleans() | st.integers(-10**6, 10**12) | st.floats(allow_nan=False,
                                                                       allow_infinity=False)
                | st.text(max_size=15))
keys = st.sampled_from([s.key for s in cfg.SETTINGS] + ["rules", "nonsense"])
sections = st.sampled_from(list(cfg.SECTIONS) + ["other"])
mappings = st.dictionaries(sections, st.dictionaries(keys, toml_scalars | st.lists(toml_scalars,
                                                                                    max_size=3),
                                                     max_size=6) | toml_scalars, max_size=4)


@settings(max_examples=300, deadline=None)
@given(data=mappings)
def test_random_settings_never_raise(data: dict) -> None:
    c = cfg.from_mapping(data)
    for s in cfg.SETTINGS:  # every value is usable: either the user's, checked, or the default
        s.check(c[s.name])
    assert all("\n" not in p for p in c.problems)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=300))
def test_random_text_files_never_raise(tmp_path_factory: pytest.TempPathFactory,
                                       text: str) -> None:
    p = tmp_path_factory.mktemp("cfg") / "config.toml"
    p.write_text(text, encoding="utf-8")
    c = cfg.load(p)
    for s in cfg.SETTINGS:
        s.check(c[s.name])
