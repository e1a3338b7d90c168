"""What the history store costs the engine.

Writes a day of 1 Hz samples of 15 series the way the engine does (``add_sample`` every second,
``flush`` every 5 s, on a simulated clock so it runs as fast as the disk allows), then times
``history()`` for one hour of raw samples and for seven days of minutes, and reopening the file.
The six days of minutes before the written day are inserted directly, since writing them sample
by sample would only repeat the first part.

    python benchmarks/bench_store.py [--hours 24] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trayapp.engine.store import Store  # noqa: E402

SERIES = (
    ["mem.available", "mem.used", "mem.total", "swap.used", "psi.some", "psi.full"]
    + [f"gpu0.{k}" for k in ("used", "util", "other", "job.j1")]
    + [f"gpu1.{k}" for k in ("used", "util")]
    + ["job.j1.rss", "job.j2.rss", "job.j1.vram"]
)
T0 = 1_800_000_000.0
FLUSH_EVERY = 5


def values(i: int) -> dict:
    return {name: 1e9 + 1e6 * math.sin(i / 300.0 + k) for k, name in enumerate(SERIES)}


def run(hours: float) -> list:
    results = []

    def add(name: str, value: float, unit: str) -> None:
        results.append({"name": name, "value": round(value, 4), "unit": unit})

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "headroom.db"
        now = [T0]
        seconds = int(hours * 3600)
        # Seven days of minutes end where the written stretch ends.
        prior_minutes = int(7 * 1440 - seconds / 60)
        store = Store(db, clock=lambda: now[0])
        store.flush()
        _insert_prior_minutes(db, T0 - prior_minutes * 60.0, prior_minutes)

        add_total = 0.0
        flush_times = []
        for i in range(seconds):
            now[0] = T0 + i
            v = values(i)
            a = time.perf_counter()
            store.add_sample(now[0], v)
            add_total += time.perf_counter() - a
            if i % FLUSH_EVERY == FLUSH_EVERY - 1:
                a = time.perf_counter()
                store.flush()
                flush_times.append(time.perf_counter() - a)
        write_total = add_total + sum(flush_times)
        add("write_day_seconds", write_total * 24 / hours, "s")
        add("add_sample_mean", add_total / seconds * 1e6, "us")
        add("flush_mean", statistics.mean(flush_times) * 1e3, "ms")
        add("flush_p99", sorted(flush_times)[int(len(flush_times) * 0.99)] * 1e3, "ms")
        add("flush_max", max(flush_times) * 1e3, "ms")
        # The share of the engine's time that storing history takes at 1 Hz.
        add("write_share_of_wall_time", write_total / seconds * 100, "%")

        end = now[0]
        h1 = _best(lambda: store.history(end - 3600, end))
        h7 = _best(lambda: store.history(end - 7 * 86400, end))
        r1 = store.history(end - 3600, end)
        r7 = store.history(end - 7 * 86400, end)
        assert r1["resolution"] == "raw" and r7["resolution"] == "minute"
        add("history_1h_raw", h1 * 1e3, "ms")
        add("history_1h_raw_points", sum(len(s["t"]) for s in r1["series"].values()), "points")
        add("history_7d_minute", h7 * 1e3, "ms")
        add("history_7d_minute_points", sum(len(s["t"]) for s in r7["series"].values()),
            "points")
        add("history_7d_to_1h_ratio", h7 / h1, "x")
        store.close()

        size = sum(p.stat().st_size for p in Path(tmp).iterdir())
        add("db_size", size / 2**20, "MiB")
        a = time.perf_counter()
        Store(db, clock=lambda: end).close()
        add("open_with_check", (time.perf_counter() - a) * 1e3, "ms")
    return results


def _insert_prior_minutes(db: Path, start: float, count: int) -> None:
    conn = sqlite3.connect(str(db))
    with conn:
        ids = []
        for name in SERIES:
            conn.execute("INSERT OR IGNORE INTO series (name) VALUES (?)", (name,))
            ids.append(conn.execute("SELECT id FROM series WHERE name = ?", (name,)).fetchone()[0])
        m0 = int(start // 60)
        conn.executemany(
            "INSERT INTO minutes (series_id, m, vmin, vmean, vmax, n) VALUES (?, ?, ?, ?, ?, 60)",
            ((sid, m0 + k, 1.0, 2.0, 3.0) for sid in ids for k in range(count)),
        )
    conn.close()


def _best(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        a = time.perf_counter()
        fn()
        times.append(time.perf_counter() - a)
    return min(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24.0,
                        help="hours of 1 Hz samples to write (default 24)")
    parser.add_argument("--json", action="store_true", help="print a JSON list of results")
    args = parser.parse_args(argv)
    if not 1 <= args.hours <= 24:
        parser.error("--hours must be between 1 and 24")
    results = run(args.hours)
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for r in results:
            print(f"{r['name']:<28} {r['value']:>12g} {r['unit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
