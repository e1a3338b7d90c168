"""The forecast: the line through measured peaks, the micro-batch that fits, the first steps'
measurement, the process's own peak memory (read from the real kernel), and the engine's
sentence against what is free and the job's budgets."""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import pytest

from trayapp.jobs import forecasts, messages
from trayapp.jobs.record import JobRecord
from trayapp.jobs.record_parts import hello_from_json
from trayapp.readings import GpuProcess, GpuReading, GpuStatus, MemoryReading, Snapshot
from trayapp.runner import forecast as rf
from trayapp.runner import protocol as rp

MiB = 2**20
GiB = 2**30


def test_the_line_goes_through_two_points_and_fits_more_by_least_squares() -> None:
    assert rf.line([(64, 100 + 64 * 3), (128, 100 + 128 * 3)]) == (100, 3.0)
    fixed, slope = rf.line([(1, 10), (2, 21), (3, 29)])
    assert slope == pytest.approx(9.5) and fixed == 1
    assert rf.line([(8, 500), (16, 400)]) == (450, 0.0)  # never less memory per sample
    assert rf.line([(8, 500), (8, 600)]) is None and rf.line([]) is None


def test_candidates_halve_while_the_batch_splits_and_stays_above_the_floor() -> None:
    assert rf.candidates(256, 32) == [(256, 1), (128, 2), (64, 4), (32, 8)]
    assert rf.candidates(96, 8) == [(96, 1), (48, 2), (24, 4), (12, 8)]  # 6 x 16 < 8
    assert rf.candidates(100, 1) == [(100, 1), (50, 2), (25, 4)]  # 25 does not halve evenly
    assert rf.candidates(256, 300) == []
    assert rf.candidates(256, 8, k=4) == [(64, 4), (32, 8), (16, 16), (8, 32)]


def device(name: str = rf.RAM, fixed: int = GiB, per_sample: int = 4 * MiB) -> Dict[str, Any]:
    return rf.device(name, fixed, per_sample, fixed + per_sample * 64, 64)


def test_the_largest_micro_batch_that_fits_every_device_is_chosen() -> None:
    ram, gpu = device(), device("GPU:0", fixed=2 * GiB, per_sample=32 * MiB)
    # RAM: 1 GiB + 4 MiB x 256 = 2 GiB; the GPU: 2 GiB + 32 MiB x micro.
    assert rf.choose([ram, gpu], 256, 8, {rf.RAM: 8 * GiB, "GPU:0": 16 * GiB}) == (256, 1)
    room = {rf.RAM: 8 * GiB, "GPU:0": 8 * GiB}  # 90%: 7.2 GiB -> 2 + 32/1024 x m <= 7.2
    assert rf.choose([ram, gpu], 256, 8, room) == (128, 2)
    assert rf.choose([ram, gpu], 256, 8, {rf.RAM: 1 * GiB}) is None
    # A device whose room is unknown does not decide.
    assert rf.choose([ram, gpu], 256, 8, {rf.RAM: 8 * GiB}) == (256, 1)


def test_accumulating_costs_a_copy_of_the_weights_where_they_live() -> None:
    ram = device(fixed=GiB, per_sample=MiB)
    room = {rf.RAM: int((GiB + 128 * MiB + 10 * MiB) / rf.MARGIN)}
    assert rf.choose([ram], 256, 8, room) == (128, 2)
    # With accumulators of 64 MiB, 128 x 2 no longer fits; 64 x 4 does.
    assert rf.choose([ram], 256, 8, room, {rf.RAM: 64 * MiB}) == (64, 4)
    assert rf.need(ram, 256, 1, 64 * MiB) == GiB + 256 * MiB  # no accumulators at k = 1


class FakeMeter:
    """Stands in for the kernel and the allocator: each read gives the next reading."""

    def __init__(self, readings: List[Dict[str, Tuple[int, int]]]):
        self.readings = list(readings)
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1

    def read(self) -> Dict[str, Tuple[int, int]]:
        return self.readings.pop(0)


def test_the_first_steps_give_the_forecast_once_after_the_traced_step() -> None:
    meter = FakeMeter([
        {rf.RAM: (500 * MiB, 500 * MiB)},  # as training begins
        {rf.RAM: (900 * MiB, 900 * MiB), "GPU:0": (3 * GiB, 3 * GiB)},  # after the first step
        {rf.RAM: (700 * MiB, 820 * MiB), "GPU:0": (3 * GiB, 5 * GiB)},  # peaks of 2 steps
    ])
    steps = rf.StepMeter(meter, 64, steps=3)  # type: ignore[arg-type]
    assert steps.measured == 2  # an epoch of 3 steps: all but its first
    assert steps.step(0) is None and meter.resets == 0
    assert steps.step(1) is None and meter.resets == 1
    assert steps.step(2) is None
    out = {d["device"]: d for d in steps.step(3) or []}
    # The host's fixed part: the base, and an allowance for what the first steps do not show
    # (the validation's step, the short last batch's trace): a share of what they added.
    assert out[rf.RAM]["fixed_bytes"] == 500 * MiB + int(rf.STEPS_ALLOWANCE * 320 * MiB)
    assert out[rf.RAM]["per_sample_bytes"] == 320 * MiB // 64
    assert out["GPU:0"]["fixed_bytes"] == 3 * GiB  # what the allocator held after a step
    assert out["GPU:0"]["per_sample_bytes"] == 2 * GiB // 64
    assert out[rf.RAM]["measured_batch"] == 64 and out[rf.RAM]["peak_bytes"] == 820 * MiB


def test_an_epoch_of_many_steps_is_measured_over_five() -> None:
    assert rf.StepMeter(None, 64).measured == rf.MEASURED_STEPS == 5
    assert rf.StepMeter(None, 64, steps=313).measured == 5
    assert rf.StepMeter(None, 64, steps=2).measured == rf.FEWEST_MEASURED == 2


def test_a_base_measured_after_tiny_steps_keeps_their_traces_out_of_the_per_sample_part() -> None:
    # Before: 500 MiB; after steps at 2 samples (the traces): 540 MiB; the peak at 64: 602 MiB.
    entry = rf.from_base(rf.RAM, 540 * MiB, 602 * MiB, 64, at=2, extra=40 * MiB)
    assert entry["per_sample_bytes"] == MiB  # 62 MiB over 62 samples, not 102 MiB over 64
    assert entry["fixed_bytes"] == 538 * MiB + 40 * MiB
    assert rf.need(entry, 64, 1) == 642 * MiB and rf.need(entry, 1024, 1) == 1602 * MiB


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's VmHWM")
def test_the_process_peak_is_the_kernels_and_a_reset_brings_it_down() -> None:
    assert rf.host_reset()
    before = rf.host_read()
    assert before is not None and before[1] >= before[0]
    block = bytearray(300 * MiB)
    for i in range(0, len(block), 4096):
        block[i] = 1  # touched: resident
    _, peak = rf.host_read() or (0, 0)
    assert peak - before[1] >= 250 * MiB
    del block
    time.sleep(0.05)
    assert rf.host_reset()
    now, peak = rf.host_read() or (0, 0)
    assert peak < before[1] + 250 * MiB and peak >= now


# -- the engine's reading --------------------------------------------------------------------


def snapshot(available: int, gpus: Tuple[GpuReading, ...] = ()) -> Snapshot:
    memory = MemoryReading(time=0.0, total_bytes=24 * GiB, available_bytes=available,
                           used_bytes=24 * GiB - available, swap_total_bytes=0,
                           swap_used_bytes=0, psi_some_avg10=None, psi_full_avg10=None)
    return Snapshot(0.0, memory, gpus, GpuStatus("nvml"))


def gpu(index: int, free: int, processes: Tuple[GpuProcess, ...] = ()) -> GpuReading:
    return GpuReading(index=index, name="NVIDIA GeForce RTX 3060", uuid=None,
                      memory_total_bytes=12 * GiB, memory_used_bytes=12 * GiB - free,
                      memory_free_bytes=free, processes=processes)


def forecast_of(devices: List[Dict[str, Any]], batch: int = 256, k: int = 1,
                how: str = rf.STEPS) -> messages.Forecast:
    msg, dropped = messages.parse_message({
        "type": rp.FORECAST, "fit": 1, "how": how, "batch": batch, "micro_batch": batch // k,
        "accumulation": k, "devices": devices})
    assert dropped == []
    assert isinstance(msg, messages.Forecast)
    return msg


def record(**fields: Any) -> JobRecord:
    values: Dict[str, Any] = {"shrinkable": True, "pids": (4242,), **fields}
    return JobRecord(id="j1", name="train", **values)


def test_the_engine_says_what_the_fit_needs_against_what_is_free() -> None:
    msg = forecast_of([device()])  # 1 GiB + 4 MiB x 256 = 2 GiB at batch 256
    said = forecasts.judge(msg, record(rss_bytes=GiB), snapshot(8 * GiB), 8)
    assert said is not None
    assert said.text == "needs about 2.0 GiB of RAM at batch 256; 9.0 GiB is free: it fits"
    assert said.fits and said.accumulation == 1
    tight = forecasts.judge(msg, record(ram_budget_bytes=int(1.7 * GiB)), snapshot(8 * GiB), 8)
    assert tight is not None and not tight.fits and tight.accumulation == 2
    assert tight.text.endswith("its budget is 1.7 GiB (1.7 GiB of it left): it will train "
                               "micro-batches of 128 x 2 (the same training)")
    # What is left of the budget, beside the budget, once the job holds some of it.
    held = forecasts.judge(msg, record(ram_budget_bytes=int(1.7 * GiB), rss_bytes=GiB),
                           snapshot(8 * GiB), 8)
    assert held is not None and "its budget is 1.7 GiB (716.8 MiB of it left)" in held.text
    # The shell's ulimit -v bounds what the job can hold, as a budget does.
    capped = record(spec={"script": "t.py", "rlimits": {"AS": [int(1.5 * GiB), None]}})
    said_as = forecasts.judge(msg, capped, snapshot(8 * GiB), 8)
    assert said_as is not None and not said_as.fits
    assert "its address-space limit (ulimit -v) is 1.5 GiB" in said_as.text
    none = forecasts.judge(msg, record(), snapshot(GiB), 8)
    assert none is not None and none.accumulation == 0
    assert none.text.endswith("it does not fit even at micro-batches of 8")
    cannot = forecasts.judge(msg, record(ram_budget_bytes=int(1.7 * GiB), shrinkable=False),
                             snapshot(8 * GiB), 8)
    assert cannot is not None and cannot.text.endswith(
        "it would fit at micro-batches of 128 x 2, but it cannot shrink")
    shrunk = forecasts.judge(forecast_of([device()], k=2),
                             record(ram_budget_bytes=int(1.7 * GiB)), snapshot(8 * GiB), 8)
    assert shrunk is not None and shrunk.fits
    assert shrunk.text.endswith("it trains micro-batches of 128 x 2 (the same training)")


def test_does_not_fit_is_said_only_when_the_forecast_is_above_the_room_at_every_micro_batch(
        ) -> None:
    # 470 MiB + 0.25 MiB a sample: 534 MiB at batch 256, 502 at 128, 486 at 64, 472 at 8.
    msg = forecast_of([device(fixed=470 * MiB, per_sample=MiB // 4)])
    budget = 490 * MiB  # none fits under 90 % of it (441 MiB); 64 x 4 fits under it
    said = forecasts.judge(msg, record(ram_budget_bytes=budget, rss_bytes=470 * MiB),
                           snapshot(8 * GiB), 8)
    assert said is not None and not said.fits and "does not fit" not in said.text
    assert "its budget is 490.0 MiB (20.0 MiB of it left)" in said.text, said.text
    assert said.accumulation == 4 and said.text.endswith(
        "it will train micro-batches of 64 x 4 (the same training)"), said.text
    small = forecasts.judge(msg, record(ram_budget_bytes=460 * MiB), snapshot(8 * GiB), 8)
    assert small is not None and small.accumulation == 0
    assert small.text.endswith("it does not fit even at micro-batches of 8")


def test_a_gpu_has_its_free_memory_what_the_job_holds_and_its_limit() -> None:
    job_on_gpu = (GpuProcess(4242, "python", 2 * GiB), GpuProcess(7, "Xorg", GiB))
    snap = snapshot(16 * GiB, (gpu(0, 3 * GiB, job_on_gpu), gpu(1, 10 * GiB)))
    rooms = forecasts.rooms(record(), snap)
    assert rooms["GPU:0"].free == 5 * GiB and rooms["GPU:0"].label == "GPU 0"
    assert rooms["GPU:1"].free == 10 * GiB
    # Only GPU 1 for the job: TensorFlow calls it GPU:0; its limit of 6000 MB bounds it.
    one = record(spec={"script": "t.py", "options": {"gpus": [1]}},
                 hello=hello_from_json({"options": {"vram_limit_mb": [6000]}}))
    rooms = forecasts.rooms(one, snap)
    assert rooms["GPU:0"].label == "GPU 1" and rooms["GPU:0"].free == 6000 * MiB
    assert rooms["GPU:0"].bound == "its limit" and "GPU:1" not in rooms
    msg = forecast_of([device("GPU:0", fixed=2 * GiB, per_sample=32 * MiB)])
    said = forecasts.judge(msg, one, snap, 8)
    assert said is not None and said.text.startswith(
        "needs about 10.0 GiB of GPU 1 at batch 256; its limit is 5.9 GiB")
    assert said.accumulation == 4  # 2 GiB + 32 MiB x 64 = 4 GiB <= 90% of 5.9 GiB


def test_nothing_is_said_without_a_reading_or_a_known_device() -> None:
    msg = forecast_of([device("TPU:0")])
    assert forecasts.judge(msg, record(), snapshot(8 * GiB), 8) is None
    assert forecasts.judge(forecast_of([device()]), record(), None, 8) is None


@pytest.mark.parametrize("field,value", [
    ("devices", [{"device": "ram", "fixed_bytes": -1, "per_sample_bytes": 1}]),
    ("devices", [{"device": "ram", "fixed_bytes": 1, "per_sample_bytes": 1, "evil": 1}]),
    ("devices", [device()] * 17), ("how", "guess"), ("batch", -4), ("accumulators", [{}]),
    ("devices", [{"device": "ram", "fixed_bytes": 2**61, "per_sample_bytes": 1}]),
])
def test_a_bad_forecast_field_is_dropped_and_counted(field: str, value: Any) -> None:
    msg, dropped = messages.parse_message({"type": rp.FORECAST, "batch": 64, field: value})
    assert dropped and field in dropped[0]
    assert field not in msg.given


def test_a_forecast_with_huge_but_possible_numbers_reads_as_a_sentence() -> None:
    # Each figure fits the machine (24 GiB of RAM); the need at a batch of 2**53 does not.
    msg = forecast_of([rf.device(rf.RAM, GiB, GiB, 2 * GiB, 1)], batch=2**53)
    said: Optional[forecasts.Judgement] = forecasts.judge(msg, record(), snapshot(8 * GiB), 8)
    assert said is not None and said.accumulation == 0
    assert said.text.startswith("needs over 1024 EiB of RAM at batch 9007199254740992;")


def test_a_forecast_above_what_the_machine_can_hold_is_dropped_and_said() -> None:
    """A job's forecast of 2**60 bytes a sample (2**113 at its batch) was never measured on a
    machine of 24 GiB of RAM and no swap: it is dropped, not judged, and said in one line."""
    absurd = forecast_of([rf.device(rf.RAM, GiB, 2**60, 2 * GiB, 64)], batch=2**53)
    kept, dropped = forecasts.bounded(absurd, record(), snapshot(8 * GiB))
    assert kept.devices == () and dropped == [
        "forecast: ram above the machine's RAM and swap (24.0 GiB)"]
    assert forecasts.judge(absurd, record(), snapshot(8 * GiB), 8) is None
    # Swap counts: the same RAM with 2 EiB of swap could hold it.
    roomy = snapshot(8 * GiB)
    roomy = Snapshot(0.0, dataclasses.replace(roomy.memory, swap_total_bytes=2**61), (),
                     GpuStatus("nvml"))
    assert forecasts.bounded(absurd, record(), roomy) == (absurd, [])


def test_a_gpu_figure_above_that_gpus_total_is_dropped_and_the_rest_kept() -> None:
    snap = snapshot(16 * GiB, (gpu(0, 10 * GiB),))  # a GPU of 12 GiB
    msg = forecast_of([device(), rf.device("GPU:0", GiB, MiB, 13 * GiB, 64),
                       device("GPU:1")])  # GPU:1: not this machine's, nothing to bound it by
    msg = dataclasses.replace(msg, accumulators=(("GPU:0", 20 * GiB), (rf.RAM, GiB)))
    kept, dropped = forecasts.bounded(msg, record(), snap)
    assert [d.device for d in kept.devices] == [rf.RAM, "GPU:1"]
    assert kept.accumulators == ((rf.RAM, GiB),)
    assert dropped == ["forecast: GPU:0 above the machine's GPU 0's total (12.0 GiB)"] * 2
    # What is within the machine passes as it came.
    fine = forecast_of([device(), device("GPU:0", fixed=2 * GiB, per_sample=32 * MiB)])
    assert forecasts.bounded(fine, record(), snap) == (fine, [])
    assert forecasts.bounded(msg, record(), None) == (msg, [])  # no reading: nothing to say


class Shaped:
    """A variable's shape and dtype without its values (a model too large to build here)."""

    def __init__(self, *shape: int, dtype: str = "float32"):
        self.shape, self.dtype = shape, dtype


def test_the_probe_does_not_set_aside_a_state_larger_than_a_quarter_of_what_is_free() -> None:
    from trayapp.runner import fitbatch

    said: List[str] = []

    class Session:
        def note(self, level: str, message: str) -> None:
            said.append(message)

    class Run:
        session = Session()

        class model:  # noqa: N801 - stands for a Keras model's attributes
            class optimizer:  # noqa: N801
                built = False
                variables: List[Shaped] = []
            # 64 Gi parameters: 256 GiB of weights, more than any test machine has free.
            variables = trainable_variables = [Shaped(65536, 1024 * 1024)]

    assert fitbatch._too_large_to_set_aside(Run())  # type: ignore[arg-type]
    assert said and "too large to set aside for the probe" in said[0]
    assert "trained at the full batch" in said[0]
    Run.model.variables = Run.model.trainable_variables = [Shaped(1024, 1024)]  # 4 MiB
    said.clear()
    assert not fitbatch._too_large_to_set_aside(Run())  # type: ignore[arg-type]
    assert said == []
    assert rf.variables_bytes([Shaped(10, 10, dtype="float16"), Shaped(3)]) == 200 + 12
