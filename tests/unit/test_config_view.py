"""The engine's settings read back from ``config_get``'s answer: what the engine sends reads
back whole, and an answer that is not one (an older engine's, garbled) reads as settings not
known, never an exception in the tray."""

from __future__ import annotations

from typing import Any

import pytest

from trayapp.config import Config
from trayapp.config.view import ConfigView


def test_the_engines_answer_reads_back_whole() -> None:
    config = Config()
    sent = {"path": "/home/u/.config/headroom/config.toml", "values": config.to_json(),
            "problems": ["config: guard.mystery is not a setting; ignored"], "version": "ab12"}
    view = ConfigView.from_json(sent)
    assert view.to_json() == sent
    assert view.value("guard.mode") == config.values["guard.mode"]
    assert view.value("guard.no_such", "fallback") == "fallback"
    assert view.section("ui") == sent["values"]["ui"]


@pytest.mark.parametrize("garbled", [
    None, 3, "config", [], {"values": "all"}, {"values": {"guard": 5}, "problems": "one"},
    {"version": 12, "path": ["x"], "problems": [1, None]},
])
def test_an_answer_that_is_not_one_reads_as_not_known(garbled: Any) -> None:
    view = ConfigView.from_json(garbled)
    assert view.section("guard") == {} and view.value("guard.mode") is None
    assert view.problems == () and view.version == "" and view.path == ""
