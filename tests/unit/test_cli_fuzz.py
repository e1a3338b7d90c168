"""The command line with flags and values made at random: either a valid spec, or exit 2 with one
line — never a traceback. Parsing and validation only: nothing is started."""

from __future__ import annotations

import contextlib
import io
import os
from typing import List

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trayapp.cli import build_parser, main
from trayapp.jobs.options import SpecError, spec_from_cli, validate

RUN_FLAGS = ["--python", "--gpu", "--cpu-only", "--memory-growth", "--no-memory-growth",
             "--vram-limit", "--vram-reserve", "--allocator", "--precision", "--xla",
             "--no-xla", "--threads", "--ram-budget", "--vram-budget", "--checkpoint-dir",
             "--checkpoint-every", "--resume", "--fresh", "--manual-resume", "--preset", "--name",
             "--cwd",
             "--env", "--dry-run", "--bogus", "-x"]
VALUES = st.sampled_from(["0", "1", "-1", "0,1", "4,2", "1024", "1e3", "abc", "", " ", "bfc",
                          "cuda_malloc_async", "mixed_float16", "desktop-safe", "throughput",
                          "cpu-only", "KEY=VALUE", "=x", "noequals", "999999999999", "1.5",
                          "/nonexistent", "train.py", "--", "ünïcode", "\r", "a\nb",
                          "\x1b[2J", "\u2028"]) | st.text(max_size=8)


@settings(max_examples=400, deadline=None)
@given(argv=st.lists(st.sampled_from(RUN_FLAGS) | VALUES, max_size=8))
def test_random_run_arguments(argv: List[str]) -> None:
    parser = build_parser()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            ns = parser.parse_args(["run", *argv])
        except SystemExit as e:
            assert e.code == 2, err.getvalue()
            assert len(err.getvalue().strip().splitlines()) == 1, err.getvalue()
            return
    try:
        spec = spec_from_cli(ns)
        validate(spec, (), check_paths=False)
    except SpecError as e:
        assert str(e) and str(e).isprintable()


# capsys is read (and so emptied) in every example, which makes it safe to share.
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=st.lists(st.sampled_from(["status", "jobs", "pause", "stop", "doctor", "engine",
                                      "--json", "--watch", "--all", "--open", "--stay",
                                      "--version", "--config"]) | VALUES, min_size=1,
                     max_size=4))
def test_random_commands_never_show_a_traceback(
        argv: List[str], capsys: pytest.CaptureFixture[str],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    # Only commands that fail fast are run: anything that would start a tray, an engine or a
    # watch loop is parsed, not run.
    try:
        ns = build_parser().parse_args(argv)
    except SystemExit as e:
        assert e.code in (0, 2)
        out = capsys.readouterr()
        assert "Traceback" not in out.err
        if e.code == 2:
            assert len(out.err.strip().splitlines()) == 1, out.err
        return
    if ns.command in (None, "engine", "status", "doctor", "jobs") or \
            getattr(ns, "watch", None):
        return
    old = os.environ.get("HEADROOM_HOME")
    os.environ["HEADROOM_HOME"] = str(tmp_path_factory.mktemp("cli-home"))
    try:
        code = main(argv)
    finally:
        if old is None:
            os.environ.pop("HEADROOM_HOME", None)
        else:
            os.environ["HEADROOM_HOME"] = old
    out = capsys.readouterr()
    assert code in (0, 1, 2, 3)
    assert "Traceback" not in out.err
