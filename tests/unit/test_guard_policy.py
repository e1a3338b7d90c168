"""The guard's Policy is config.SETTINGS' [guard] section: one attribute per setting, with its
default, read from a loaded config; each setting carries what the settings window shows."""

from __future__ import annotations

from typing import Any

import pytest

from trayapp import config
from trayapp.config import GUARD_SETTINGS, SETTINGS, Config, Setting, Threshold
from trayapp.engine.guard import Policy, Rule


def test_every_guard_setting_is_an_attribute_with_its_default() -> None:
    p = Policy()
    for key, s in GUARD_SETTINGS.items():
        value = getattr(p, key)
        if s.kind == "threshold":
            assert value == Threshold.parse(s.default), key
        else:
            assert value == s.default and type(value) is type(s.default) or \
                s.kind == "number" and isinstance(value, float), key
    assert p.rules == ()


def _other(s: Setting) -> Any:
    """A valid value of ``s`` other than its default."""
    if s.kind == "bool":
        return not s.default
    if s.kind == "choice":
        return "off" if s.default != "off" else "act"
    if s.kind == "threshold":
        return "3 GiB"
    low = s.minimum if s.minimum is not None else 0.0
    high = s.maximum if s.maximum is not None else 2 * s.default + 1
    return (low + high) / 2 if (low + high) / 2 != s.default else low


@pytest.mark.parametrize("key", sorted(GUARD_SETTINGS))
def test_each_guard_setting_reaches_the_policy(key: str) -> None:
    s = GUARD_SETTINGS[key]
    value = s.check(_other(s))
    cfg = Config()
    cfg.values[s.name] = value
    p = Policy.from_config(cfg)
    expected = Threshold.parse(value) if s.kind == "threshold" else value
    assert getattr(p, key) == expected != getattr(Policy(), key)
    assert p != Policy()


def test_rules_come_from_the_config() -> None:
    cfg = Config(rules=[{"process": "chrome*", "action": "pause"}, {"process": "x"}])
    assert Policy.from_config(cfg).rules == (Rule("chrome*", "pause"), Rule("x", "warn"))


def test_a_policy_takes_only_guard_settings_and_does_not_change() -> None:
    with pytest.raises(TypeError, match="not a guard setting: sample_interval"):
        Policy(sample_interval=1.0)
    p = Policy(warn_available="2 GiB", pause_horizon_seconds=0)
    assert p.warn_available == Threshold(size_bytes=2 << 30)
    assert p.pause_horizon_seconds == 0.0
    with pytest.raises(AttributeError):
        p.mode = "off"  # type: ignore[misc]
    with pytest.raises(AttributeError, match="no setting nonsense"):
        p.nonsense  # noqa: B018
    assert p == Policy(warn_available=Threshold(size_bytes=2 << 30), pause_horizon_seconds=0.0)
    assert hash(p) == hash(Policy(warn_available="2 GiB", pause_horizon_seconds=0))
    assert "warn_available" in repr(p) and "mode" not in repr(p)


def test_every_setting_has_the_words_the_window_shows() -> None:
    for s in SETTINGS:
        assert s.label and s.label[0].isupper(), s.name
        assert s.kind in ("bool", "choice", "threshold", "number", "text"), s.name
        assert (s.kind == "choice") == bool(s.choices), s.name
        if s.kind != "number":
            assert s.unit == "", s.name
        if s.key.endswith("_seconds"):
            assert s.unit == "s", s.name
    assert config.SETTINGS_BY_NAME["history.keep_days"].unit == "days"
    assert config.SETTINGS_BY_NAME["guard.mode"].choices == ("act", "dry-run", "off")
