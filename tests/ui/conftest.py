"""Qt tests run on the offscreen platform, each on its own HEADROOM_HOME."""

from __future__ import annotations

import os

# Before anything imports Qt: no display is needed for these tests.
os.environ["QT_QPA_PLATFORM"] = "offscreen"

import pytest  # noqa: E402


@pytest.fixture
def demo_engine(start_engine):  # type: ignore[no-untyped-def]
    """A real engine in --demo mode (simulated GPUs) on the test's HEADROOM_HOME."""
    return start_engine(demo=True)
