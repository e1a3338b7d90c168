"""`headroom status` as text: every part of the status object reads at a glance."""

from __future__ import annotations

from trayapp.cli import format_status
from trayapp.engine.status_record import Status

GiB = 2**30

STATUS = {
    "time": 1796050000.0,
    "memory": {"total_bytes": 32 * GiB, "available_bytes": 3 * GiB, "used_bytes": 29 * GiB,
               "swap_total_bytes": 8 * GiB, "swap_used_bytes": 2 * GiB,
               "psi_some_avg10": 12.5, "psi_full_avg10": 4.25, "limit_source": "cgroup"},
    "gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 3090", "memory_total_bytes": 24 * GiB,
              "memory_used_bytes": 20 * GiB, "utilization_percent": 97.0,
              "temperature_c": 71.0, "power_watts": None, "simulated": False,
              "processes": [{"pid": 4223, "name": "python3", "used_memory_bytes": 18 * GiB},
                            {"pid": 4201, "name": "Xorg", "used_memory_bytes": None}]}],
    "gpu_status": {"backend": "nvml", "driver_version": "550.54.14",
                   "cuda_driver_version": "12.4"},
    "guard": {"state": "warn", "mode": "act", "seconds_to_exhaustion": 42.0,
              "reasons": ["available memory 3.0 GiB is below the warning threshold 4.8 GiB"]},
    "jobs": [{"id": "ab12cd34", "name": "mnist", "state": "running", "epoch": 3, "epochs": 10,
              "step": 50, "steps": 100, "metrics": {"loss": 0.1234}, "eta_seconds": 90,
              "rss_bytes": 6 * GiB, "vram_bytes": 18 * GiB, "exit_code": None}],
    "engine": {"running": True, "pid": 999},
}


def text_of(sent: object) -> str:
    """``headroom status`` of what an engine sent, read as the CLI reads it."""
    return format_status(Status.from_json(sent))


def test_every_part_is_shown() -> None:
    text = text_of(STATUS)
    assert "engine running (pid 999) · guard warn" in text
    assert "memory runs out in ~42 s" in text
    assert "! available memory 3.0 GiB is below the warning threshold" in text
    assert "RAM    3.0 GiB available of 32.0 GiB (cgroup limit), 91% used" in text
    assert "Swap   2.0 GiB used of 8.0 GiB" in text
    assert "Pressure some 12.5%  full 4.2%" in text
    assert "GPU 0  NVIDIA GeForce RTX 3090 | 20.0 GiB / 24.0 GiB | util 97% | 71°C | n/a" in text
    # A process whose memory the driver cannot tell reads n/a, never 0.
    assert "python3 (4223) 18.0 GiB, Xorg (4201) n/a" in text
    assert "driver 550.54.14, CUDA 12.4" in text
    assert "mnist [ab12cd34] running · epoch 3/10 · step 50/100 · loss 0.1234" in text
    assert "RAM 6.0 GiB · VRAM 18.0 GiB" in text


def test_without_engine_gpu_or_pressure() -> None:
    st = dict(STATUS, gpus=[], jobs=[], engine={"running": False},
              gpu_status={"backend": "none", "message": "no NVIDIA GPU found"},
              guard={"state": None, "reasons": ["no engine is running"]},
              memory=dict(STATUS["memory"], psi_some_avg10=None, swap_total_bytes=0))
    text = text_of(st)
    assert "no engine is running" in text
    assert "GPU    no NVIDIA GPU found" in text
    assert "Pressure n/a" in text and "Swap   none" in text and "Jobs   none" in text


def test_a_garbled_gpu_or_job_is_left_out_and_the_rest_shown() -> None:
    st = dict(STATUS, gpus=[{"name": "no index"}, "gpu", STATUS["gpus"][0]],
              jobs=[{"name": "no id"}, 3, dict(STATUS["jobs"][0], epoch="three")],
              gpu_status="garbled")
    text = text_of(st)
    assert "no index" not in text and "no id" not in text
    assert "GPU 0  NVIDIA GeForce RTX 3090 | 20.0 GiB / 24.0 GiB" in text
    # A field of the wrong type is not known: the epoch under way reads 0 of 10.
    assert "mnist [ab12cd34] running · epoch 0/10 · step 50/100" in text
    assert "driver" not in text  # the GPU status could not be read


def test_where_the_exporter_serves_or_why_not() -> None:
    def shown(metrics: object) -> list:
        text = text_of(dict(STATUS, engine={"running": True, "pid": 1, "metrics": metrics}))
        return [line for line in text.splitlines() if line.startswith("Metrics")]

    assert shown({"listen": "127.0.0.1:9835", "tls": False, "error": None}) == \
        ["Metrics http://127.0.0.1:9835/metrics (for Prometheus)"]
    assert shown({"listen": "0.0.0.0:9835", "tls": True, "error": None}) == \
        ["Metrics https://0.0.0.0:9835/metrics (for Prometheus)"]
    assert shown({"listen": None, "tls": False, "error":
                  "cannot serve metrics on 127.0.0.1:9835: Address already in use"}) == \
        ["Metrics ! cannot serve metrics on 127.0.0.1:9835: Address already in use"]
    assert shown({"listen": None, "tls": False, "error": None}) == []  # off: not a word
    assert shown(None) == []


def test_the_protection_jobs_get_is_said() -> None:
    def shown(protection: object) -> list:
        text = text_of(dict(STATUS, engine={"running": True, "pid": 1,
                                                  "protection": protection}))
        return [line for line in text.splitlines() if line.startswith("Protection")]

    assert shown({"words": "kernel brake (cgroup v1)"}) == ["Protection kernel brake (cgroup v1)"]
    assert shown({"words": "none: the guard only (no cgroups on this system)"}) == \
        ["Protection none: the guard only (no cgroups on this system)"]
    assert shown(None) == [] and shown("garbled") == []
