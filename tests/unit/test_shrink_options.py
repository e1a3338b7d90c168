"""--on-oom and --min-batch: from the command line and JSON to the runner's options."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from trayapp.jobs import spec_values as sv
from trayapp.jobs.options import JobSpec, SpecError, add_run_arguments, spec_from_cli, validate
from trayapp.jobs.plan import build_launch, format_plan
from trayapp.runner import protocol, tfoptions

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "runner" / "plain.py"


def parse(*argv: str) -> JobSpec:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return spec_from_cli(parser.parse_args([*argv, str(SCRIPT)]))


def runner_options(spec: JobSpec) -> dict:
    plan = build_launch(spec, job_id="t", address="", keyfile="")
    return tfoptions.read_options(plan.env[protocol.ENV_OPTIONS])


def test_by_default_a_job_shrinks_down_to_eight() -> None:
    spec = parse()
    assert (spec.on_oom, spec.min_batch) == ("shrink", None)
    options = runner_options(JobSpec(script=str(SCRIPT), python=sys.executable))
    assert (options["on_oom"], options["min_batch"]) == ("shrink", sv.MIN_BATCH_DEFAULT)


def test_the_flags_reach_the_runner_and_survive_json() -> None:
    spec = parse("--on-oom", "stop", "--min-batch", "32")
    assert (spec.on_oom, spec.min_batch) == ("stop", 32)
    assert JobSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    options = runner_options(JobSpec(script=str(SCRIPT), python=sys.executable, on_oom="stop",
                                     min_batch=32))
    assert (options["on_oom"], options["min_batch"]) == ("stop", 32)


@pytest.mark.parametrize("spec,field,words", [
    (JobSpec(script=str(SCRIPT), min_batch=0), sv.MIN_BATCH, "--min-batch: 0 is not a batch"),
    (JobSpec(script=str(SCRIPT), on_oom="retry"), sv.ON_OOM, "--on-oom: 'retry' is not one of"),
])
def test_bad_values_are_refused_naming_their_field(spec: JobSpec, field: str, words: str) -> None:
    with pytest.raises(SpecError) as e:
        validate(spec)
    assert e.value.field == field and words in str(e.value) and "\n" not in str(e.value)


def test_a_min_batch_that_is_not_a_number_is_one_line() -> None:
    with pytest.raises(SpecError, match="--min-batch: 'many' is not a batch size"):
        parse("--min-batch", "many")


@pytest.mark.parametrize("raw,words", [
    ({"on_oom": "later"}, "on_oom"), ({"min_batch": 0}, "min_batch"),
    ({"on_oom": 3}, "on_oom"), ({"min_batch": "8"}, "min_batch"),
])
def test_the_runner_refuses_options_it_cannot_apply(raw: dict, words: str) -> None:
    with pytest.raises(tfoptions.OptionError, match=words):
        tfoptions.read_options(json.dumps(raw))


def test_the_dry_run_says_what_an_oom_does() -> None:
    shrinking = format_plan(build_launch(JobSpec(script=str(SCRIPT), python=sys.executable),
                                         job_id="dry-run"))
    assert "Out of memory in fit():\n  shrink: micro-batches of half the batch" in shrinking
    assert "down to 8" in shrinking
    stopping = format_plan(build_launch(JobSpec(script=str(SCRIPT), python=sys.executable,
                                                on_oom="stop"), job_id="dry-run"))
    assert "stop: the job fails, as without Headroom" in stopping
