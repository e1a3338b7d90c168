"""What the Machines window says (no Qt): its status line and the cells of each machine and
job row, from a ``Fleet`` or the reason there is none."""

from __future__ import annotations

from typing import List, Optional

from trayapp.formats import NA, clock, format_bytes, percent
from trayapp.ui.machines_query import Fleet, Job, Machine, shown_url

COLUMNS = ("Machine / job", "RAM", "VRAM", "Guard / state", "Jobs / progress")
GUARD_WORDS = {"ok": "ok", "warn": "warning", "pause": "pausing jobs", "park": "parking jobs"}
NO_URL = (
    "No Prometheus server is set. Enter its URL in Settings › Metrics and machines; "
    'it must scrape each machine\'s Headroom exporter as the job "headroom".'
)
NO_SETTINGS = "Reading the settings from the engine…"


def status_line(
    url: str, fleet: Optional[Fleet], error: Optional[str], refresh_seconds: float
) -> str:
    """One line above the table: where the numbers come from and when, or why there are none."""
    if not url:
        return NO_URL
    url = shown_url(url)  # never the password of a user:password@ in it
    every = f"{refresh_seconds:g} s"
    if error is not None:
        check = (
            " Is it running, and is its URL in Settings › Metrics and machines right?"
            if error.startswith(("cannot reach", "no answer"))
            else ""
        )
        return f"Prometheus at {url}: {error}.{check} Trying again every {every}."
    if fleet is None:
        return f"Asking Prometheus at {url}…"
    if not fleet.machines:
        return (
            f"Prometheus at {url} answers, but it has no machine running Headroom: no "
            "headroom_* series. Is the exporter on ([metrics] listen) and scraped as the "
            'job "headroom"?'
        )
    n = len(fleet.machines)
    down = sum(1 for m in fleet.machines if m.up is False)
    at = f" at {clock(fleet.time)}" if fleet.time else ""
    words = f"{n} machine{'s' if n != 1 else ''}" + (f", {down} not answering" if down else "")
    return f"{words}, from Prometheus at {url}{at}; every {every}."


def machine_label(m: Machine) -> str:
    if m.host and m.host not in m.instance:
        return f"{m.host} ({m.instance})"
    return m.instance


def machine_cells(m: Machine) -> List[str]:
    """The machine's row: name, RAM, VRAM, guard, jobs."""
    if m.up is False and m.ram_total_bytes is None:
        return [machine_label(m), NA, NA, "not answering", ""]
    ram = NA
    if m.ram_available_bytes is not None:
        ram = (
            f"{format_bytes(m.ram_available_bytes)} available of "
            f"{format_bytes(m.ram_total_bytes)} "
            f"({percent(m.ram_available_bytes, m.ram_total_bytes)})"
        )
    vram = (
        "no GPU"
        if not m.gpus
        else (f"{format_bytes(m.vram_used_bytes)} used of {format_bytes(m.vram_total_bytes)}")
    )
    guard = GUARD_WORDS.get(m.guard or "", NA)
    if m.up is False:
        guard = "not answering"
    running = len(m.jobs)
    jobs = "none" if not running else f"{running} job{'s' if running != 1 else ''}"
    return [machine_label(m), ram, vram, guard, jobs]


def gpu_cells(index: str, name: str, used: Optional[float], total: Optional[float]) -> List[str]:
    return [
        f"GPU {index}: {name}" if name else f"GPU {index}",
        "",
        f"{format_bytes(used)} used of {format_bytes(total)}",
        "",
        "",
    ]


def job_cells(j: Job) -> List[str]:
    """A job's row under its machine: name (id), its RAM, its VRAM, its state, its progress."""
    name = f"{j.name} (job {j.id})" if j.name and j.id else (j.name or f"job {j.id}")
    progress = NA if j.progress_ratio is None else f"{100 * j.progress_ratio:.0f}% done"
    return [
        name,
        format_bytes(j.ram_bytes) if j.ram_bytes is not None else NA,
        format_bytes(j.vram_bytes) if j.vram_bytes is not None else NA,
        j.state or NA,
        progress,
    ]
