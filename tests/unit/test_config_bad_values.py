"""config.toml as an attacker or a slip of the keyboard writes it: numbers past a float's range,
NaN and infinity, arrays nested thousands deep, long strings, a huge file. Each gives a
one-line message naming the key and its default (or saying the file cannot be read), and the
engine's policy can be built from what was loaded."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trayapp import config as cfg
from trayapp.config import ConfigError
from trayapp.engine.config_watch import STATUS_PROBLEMS, shown_problems
from trayapp.engine.guard import Policy

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def load_text(tmp_path: Path, text: str) -> cfg.Config:
    p = tmp_path / "config.toml"
    p.write_text(text, encoding="utf-8")
    return cfg.load(p)


def usable(c: cfg.Config) -> None:
    """Every value passes its own check, every number is finite, the guard's policy builds."""
    for s in cfg.SETTINGS:
        v = c[s.name]
        s.check(v)
        if isinstance(v, float):
            assert math.isfinite(v), (s.name, v)
    Policy.from_config(c)
    assert all("\n" not in p and len(p) < 400 for p in c.problems), c.problems


@pytest.mark.parametrize("line,name", [
    ("[guard]\nresume_available = 1e400", "guard.resume_available"),
    ("[guard]\nwarn_available = -1e400", "guard.warn_available"),
    ("[guard]\npause_available = inf", "guard.pause_available"),
    ("[guard]\npark_available = nan", "guard.park_available"),
    ("[guard]\nstop_available = \"" + "9" * 400 + " GiB\"", "guard.stop_available"),
    ("[guard]\nhysteresis = " + "9" * 40, "guard.hysteresis"),
    ("[engine]\nsample_interval = nan", "engine.sample_interval"),
    ("[engine]\nidle_exit_seconds = inf", "engine.idle_exit_seconds"),
    ("[engine]\npublish_hz = -inf", "engine.publish_hz"),
    ("[guard]\ncooldown_seconds = 1e400", "guard.cooldown_seconds"),
])
def test_numbers_out_of_range_name_the_key_and_its_default(tmp_path: Path, line: str,
                                                            name: str) -> None:
    c = load_text(tmp_path, line + "\n")
    default = cfg.SETTINGS_BY_NAME[name].default
    assert c[name] == default
    assert len(c.problems) == 1, c.problems
    assert name in c.problems[0] and f"using the default {default!r}" in c.problems[0]
    usable(c)


def test_integers_past_a_float_are_refused_not_raised() -> None:
    # TOML's integers are 64-bit, but a mapping can come from elsewhere (a client's config_set).
    c = cfg.from_mapping({"engine": {"sample_interval": 10**400},
                          "guard": {"warn_available": 10**400}})
    text = "\n".join(c.problems)
    assert "engine.sample_interval" in text and "guard.warn_available" in text
    assert c["engine.sample_interval"] == 1.0 and c["guard.warn_available"] == "15%"
    usable(c)
    for name, value in (("engine.sample_interval", 10**400), ("guard.pause_available", 1e400),
                        ("engine.sample_interval", float("nan"))):
        with pytest.raises(ConfigError):
            cfg.SETTINGS_BY_NAME[name].check(value)


@pytest.mark.parametrize("where", ["[guard]\nrules = ", "[guard]\nmode = ", "x = ",
                                   "[engine]\nsample_interval = "])
def test_an_array_nested_5000_deep_is_a_file_that_cannot_be_read(tmp_path: Path,
                                                                   where: str) -> None:
    text = where + "[" * 5000 + "]" * 5000 + "\n"
    c = load_text(tmp_path, text)
    assert len(c.problems) == 1
    assert "cannot be read" in c.problems[0] and "using the defaults" in c.problems[0]
    assert "nested too deeply" in c.problems[0]
    assert c.values == cfg.Config().values
    usable(c)
    assert (tmp_path / "config.toml").read_text(encoding="utf-8") == text  # left as it was


def test_inline_tables_nested_deep_too(tmp_path: Path) -> None:
    c = load_text(tmp_path, "[guard]\nmode = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n")
    assert len(c.problems) == 1 and "cannot be read" in c.problems[0]
    usable(c)


def test_a_value_nested_as_deep_as_the_parser_allows_gives_a_short_message(
        tmp_path: Path) -> None:
    depth = 1
    # The deepest array the parser still reads (its limit depends on the stack).
    for n in (400, 300, 200, 100, 50):
        try:
            tomllib.loads("a = " + "[" * n + "]" * n)
        except RecursionError:
            continue
        depth = n
        break
    c = load_text(tmp_path, "[guard]\nwarn_available = " + "[" * depth + "]" * depth + "\n"
                  "[engine]\nsample_interval = " + "[" * depth + "]" * depth + "\n")
    assert c["guard.warn_available"] == "15%" and c["engine.sample_interval"] == 1.0
    assert any("guard.warn_available" in p for p in c.problems)
    usable(c)


def test_long_strings_give_short_messages(tmp_path: Path) -> None:
    c = load_text(tmp_path, "[guard]\nmode = \"" + "x" * 200_000 + "\"\n"
                  "warn_available = \"" + "7" * 100_000 + "%\"\n")
    assert c["guard.mode"] == "act" and c["guard.warn_available"] == "15%"
    assert len(c.problems) == 2
    usable(c)


def test_a_huge_file_is_not_read_whole(tmp_path: Path) -> None:
    p = tmp_path / "config.toml"
    with open(p, "w", encoding="utf-8") as f:
        f.write("[guard]\nmode = \"off\"\n")
        f.write(("# " + "x" * 1000 + "\n") * 3000)  # 3 MB of comments
    c = cfg.load(p)
    assert c["guard.mode"] == "act"
    assert len(c.problems) == 1 and "larger than" in c.problems[0]
    usable(c)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_in_the_files_place_does_not_hang(tmp_path: Path) -> None:
    p = tmp_path / "config.toml"
    os.mkfifo(p)
    c = cfg.load(p)
    assert len(c.problems) == 1 and "not a regular file" in c.problems[0]
    assert not cfg.changed_since(c)
    usable(c)


def test_save_value_refuses_out_of_range_numbers(tmp_path: Path) -> None:
    p = tmp_path / "config.toml"
    p.write_text("[guard]\nmode = \"off\"\n")
    for name, value in (("guard.resume_available", 1e400), ("engine.sample_interval", 10**400),
                        ("engine.sample_interval", float("nan"))):
        with pytest.raises(ConfigError):
            cfg.save_value(p, name, value)
    assert p.read_text() == "[guard]\nmode = \"off\"\n"


def test_save_value_refuses_a_file_changed_since_it_was_read(tmp_path: Path) -> None:
    p = tmp_path / "config.toml"
    p.write_text("[guard]\nmode = \"off\"\n")
    seen = cfg.load(p).version
    assert seen and cfg.file_version(p) == seen
    p.write_text("[guard]\nmode = \"off\"\npause_available = \"9%\"\n")  # a hand edit
    with pytest.raises(cfg.ConfigConflict, match="changed"):
        cfg.save_value(p, "guard.warn_available", "20%", version=seen)
    assert "pause_available" in p.read_text() and "20%" not in p.read_text()
    # Without a version (or with the current one) the save keeps the hand edit.
    cfg.save_value(p, "guard.warn_available", "20%", version=cfg.file_version(p))
    c = cfg.load(p)
    assert c["guard.pause_available"] == "9%" and c["guard.warn_available"] == "20%"
    assert c["guard.mode"] == "off"


def test_an_edit_is_noticed_by_its_stamp_or_within_the_clock_tick_by_its_bytes(
        tmp_path: Path) -> None:
    p = tmp_path / "config.toml"
    p.write_text("[guard]\nmode = \"off\"\n")
    c = cfg.load(p)
    assert not cfg.changed_since(c)
    p.write_text("[guard]\nmode = \"act\"\n# a longer file\n")
    assert cfg.changed_since(c)
    c = cfg.load(p)
    assert not cfg.changed_since(c)
    # An edit in the same tick of the file clock keeps the stamp: the bytes tell, while the
    # file's time is recent.
    racy = cfg.Config(path=p, stamp=c.stamp, version="not these bytes")
    assert cfg.changed_since(racy)
    old = 1_000_000_000 * 10**9
    os.utime(p, ns=(old, old))
    settled = cfg.load(p)
    assert not cfg.changed_since(cfg.Config(path=p, stamp=settled.stamp, version="other"))
    p.unlink()
    assert cfg.changed_since(settled)  # removed: the defaults again


def test_the_status_shows_a_few_problems_and_counts_the_rest() -> None:
    c = cfg.from_mapping({"guard": {f"k{i}": i for i in range(5000)}})
    assert len(c.problems) == 5000
    shown = shown_problems(c.problems)
    assert len(shown) == STATUS_PROBLEMS and "4991 more" in shown[-1]
    assert shown_problems(c.problems[:2]) == c.problems[:2]


# -- at random ------------------------------------------------------------------------------------

huge_numbers = (st.floats() | st.integers() | st.integers(min_value=2**63, max_value=10**500)
                | st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e308, -1e308,
                                   5e-324, 10**400]))
scalars = (huge_numbers | st.booleans() | st.text(max_size=20)
           | st.text(alphabet="0123456789.%eE GiBMk-", max_size=40))
nested = st.recursive(scalars, lambda children: st.lists(children, max_size=3)
                      | st.dictionaries(st.text(max_size=5), children, max_size=3),
                      max_leaves=30)
keys = st.sampled_from([s.key for s in cfg.SETTINGS] + ["rules", "nonsense"])
sections = st.sampled_from(list(cfg.SECTIONS) + ["other"])
mappings = st.dictionaries(sections, st.dictionaries(keys, nested, max_size=6) | nested,
                           max_size=4)


@settings(max_examples=300, deadline=None)
@given(data=mappings)
def test_random_huge_and_nested_values_never_raise(data: Any) -> None:
    usable(cfg.from_mapping(data))


def deep(kind: str, n: int) -> str:
    if kind == "array":
        return "[" * n + "1" + "]" * n
    if kind == "table":
        return "{a = " * n + "1" + "}" * n
    return "[{a = " * n + "1" + "}]" * n


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from([s.name for s in cfg.SETTINGS] + ["guard.rules", "other.x"]),
       kind=st.sampled_from(["array", "table", "mixed"]), depth=st.integers(1, 20_000))
def test_random_deep_nesting_in_a_file_never_raises(tmp_path_factory: pytest.TempPathFactory,
                                                    key: str, kind: str, depth: int) -> None:
    section, name = key.split(".")
    p = tmp_path_factory.mktemp("cfg") / "config.toml"
    p.write_text(f"[{section}]\n{name} = {deep(kind, depth)}\n", encoding="utf-8")
    usable(cfg.load(p))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from([s.name for s in cfg.SETTINGS]),
       literal=st.sampled_from(["1e400", "-1e400", "inf", "-inf", "nan", "+nan",
                                "9" * 30, "-" + "9" * 30, "\"" + "9" * 400 + "\"",
                                "\"" + "9" * 400 + "%\"", "\"1e400%\"", "\"nan%\"",
                                "\"" + "9" * 30 + " TiB\""]))
def test_random_out_of_range_literals_in_a_file(tmp_path_factory: pytest.TempPathFactory,
                                                key: str, literal: str) -> None:
    section, name = key.split(".")
    p = tmp_path_factory.mktemp("cfg") / "config.toml"
    p.write_text(f"[{section}]\n{name} = {literal}\n", encoding="utf-8")
    c = cfg.load(p)
    usable(c)
    if c.problems and "cannot be read" not in c.problems[0]:
        assert any(key in q for q in c.problems)
