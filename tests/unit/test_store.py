"""The engine's SQLite store, on real SQLite files."""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import List

import pytest

from trayapp.engine import store as store_module
from trayapp.engine.event_record import EngineEvent
from trayapp.engine.store import SCHEMA_VERSION, Store
from trayapp.jobs.record import JobRecord
from trayapp.jobs.record_parts import Note
from trayapp.vocab import JobState as S

T0 = 1_800_000_000.0  # a whole minute (divisible by 60)
REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "headroom.db"


@pytest.fixture
def store(db: Path, clock: Clock):
    s = Store(db, clock=clock)
    try:
        yield s
    finally:
        s.close()


def rows(db: Path, sql: str, args=()) -> list:
    """Read the file through a second connection: what is really on disk."""
    conn = sqlite3.connect(str(db))
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------
# Samples and history


def test_samples_are_buffered_until_flush_and_none_is_not_stored(store: Store, db: Path):
    store.add_sample(T0, {"mem.used": 10.0, "mem.total": 100.0, "gpu0.used": None})
    assert rows(db, "SELECT COUNT(*) FROM samples") == [(0,)]
    store.flush()
    assert rows(db, "SELECT COUNT(*) FROM samples") == [(2,)]
    names = {n for (n,) in rows(db, "SELECT name FROM series")}
    assert names == {"mem.used", "mem.total"}


def test_at_most_one_sample_a_second_per_series(store: Store, clock: Clock):
    for dt in (0.0, 0.3, 0.9, 1.0, 1.5, 2.2, 2.9, 3.3):
        store.add_sample(T0 + dt, {"a": dt})
    store.add_sample(T0 + 0.5, {"b": 1.0})  # its own series: not held back by "a"
    store.flush()
    # Also across a flush: the last kept sample is at +3.3.
    store.add_sample(T0 + 3.8, {"a": 99.0})
    store.add_sample(T0 + 4.3, {"a": 4.3})
    h = store.history(T0, T0 + 10)
    assert h["series"]["a"]["t"] == [T0, T0 + 1.0, T0 + 2.2, T0 + 3.3, T0 + 4.3]
    assert h["series"]["a"]["v"] == [0.0, 1.0, 2.2, 3.3, 4.3]
    assert h["series"]["b"]["t"] == [T0 + 0.5]


def test_dedup_remembers_the_last_stored_sample_across_reopen(db: Path, clock: Clock):
    with Store(db, clock=clock) as s:
        s.add_sample(T0, {"a": 1.0})
    with Store(db, clock=clock) as s:
        s.add_sample(T0 + 0.5, {"a": 2.0})
        s.add_sample(T0 + 1.0, {"a": 3.0})
        assert s.history(T0 - 1, T0 + 2)["series"]["a"]["v"] == [1.0, 3.0]


def test_bad_values_are_skipped_not_raised(store: Store):
    store.add_sample(T0, {"a": float("nan"), "b": "x", "c": float("inf"), "d": 2, "": 1.0})
    store.add_sample(float("nan"), {"e": 1.0})
    store.add_sample("soon", {"e": 1.0})  # type: ignore[arg-type]
    store.add_sample(T0, None)  # type: ignore[arg-type]
    store.flush()
    assert store.history(T0 - 1, T0 + 1)["series"] == {"d": {"t": [T0], "v": [2.0]}}


def test_buffered_samples_show_in_history_raw_and_minute(store: Store, clock: Clock):
    for i in range(120):
        store.add_sample(T0 + i, {"mem.used": float(i)})
    store.flush()
    for i in range(120, 180):
        store.add_sample(T0 + i, {"mem.used": float(i)})  # not flushed
    clock.t = T0 + 180
    raw = store.history(T0, T0 + 180)
    assert raw["resolution"] == "raw"
    assert raw["series"]["mem.used"]["v"] == [float(i) for i in range(180)]
    minute = store.history(T0 - 7 * 3600, T0 + 180)
    assert minute["resolution"] == "minute"
    m = minute["series"]["mem.used"]
    assert m["t"] == [T0, T0 + 60, T0 + 120]
    assert m["min"] == [0.0, 60.0, 120.0]
    assert m["max"] == [59.0, 119.0, 179.0]
    assert m["mean"] == [29.5, 89.5, 149.5]


def test_minute_roll_up_is_min_mean_max_of_completed_minutes_only(
    store: Store, clock: Clock, db: Path
):
    values = {}
    for i in range(150):  # two whole minutes and half of a third
        v = float((i * 37) % 101)
        values[i] = v
        store.add_sample(T0 + i, {"gpu0.used": v, "mem.used": -v})
    clock.t = T0 + 150
    store.flush()
    got = rows(
        db,
        "SELECT s.name, m.m, m.vmin, m.vmean, m.vmax, m.n FROM minutes m"
        " JOIN series s ON s.id = m.series_id ORDER BY s.name, m.m",
    )
    expected = []
    for name, sign in (("gpu0.used", 1), ("mem.used", -1)):
        for k in range(2):  # the third minute is not over: not rolled up
            vs = [sign * values[i] for i in range(60 * k, 60 * k + 60)]
            expected.append(
                (name, int(T0 // 60) + k, min(vs), sum(vs) / 60, max(vs), 60)
            )
    assert [r[:2] + tuple(round(x, 9) for x in r[2:5]) + r[5:] for r in got] == [
        e[:2] + tuple(round(x, 9) for x in e[2:5]) + e[5:] for e in expected
    ]


def test_roll_up_runs_about_once_a_minute_and_only_on_new_minutes(
    store: Store, clock: Clock, db: Path
):
    def count() -> int:
        return rows(db, "SELECT COUNT(*) FROM minutes")[0][0]

    for i in range(60):
        store.add_sample(T0 + i, {"a": 1.0})
    clock.t = T0 + 60
    store.flush()
    assert count() == 1
    for i in range(60, 180):
        store.add_sample(T0 + i, {"a": 2.0})
    clock.t = T0 + 100
    store.flush()  # less than a minute since the last roll-up: nothing new yet
    assert count() == 1
    clock.t = T0 + 180
    store.flush()
    assert count() == 3
    # The first minute kept its own values: it was not rolled up again from newer data.
    assert rows(db, "SELECT vmean FROM minutes ORDER BY m") == [(1.0,), (2.0,), (2.0,)]


def test_a_late_sample_re_rolls_its_minute(store: Store, clock: Clock, db: Path):
    for i in range(0, 60, 10):
        store.add_sample(T0 + i, {"a": 1.0})
    clock.t = T0 + 120
    store.flush()
    assert rows(db, "SELECT vmax, n FROM minutes") == [(1.0, 6)]
    store.add_sample(T0 + 55, {"a": 8.0})  # the clock stepped back: its minute is done
    store.flush()
    assert rows(db, "SELECT vmax, n FROM minutes") == [(8.0, 7)]


def test_retention_drops_raw_after_raw_hours_and_the_rest_after_keep_days(
    db: Path, clock: Clock
):
    with Store(db, raw_hours=1, keep_days=1, clock=clock) as s:
        for i in range(0, 120):
            s.add_sample(T0 + i, {"a": float(i)})
        s.add_event("old", "an old event", t=T0)
        s.save_row({"id": "done", "state": "exited", "started": T0, "ended": T0 + 10})
        s.save_row({"id": "parked", "state": "parked", "started": T0, "ended": T0 + 10})
        s.save_row({"id": "running", "state": "running", "started": T0, "ended": None})
        clock.t = T0 + 120
        s.flush()
        assert rows(db, "SELECT COUNT(*) FROM samples")[0][0] == 120

        clock.t = T0 + 3600 + 61  # the first minute is past the raw tier
        s.add_sample(clock.t, {"c": 0.0})
        s.flush()
        assert rows(db, "SELECT MIN(t) FROM samples")[0][0] >= T0 + 60
        assert rows(db, "SELECT COUNT(*) FROM minutes WHERE m = ?", (int(T0 // 60),)) == [(1,)]
        assert [e.kind for e in s.events()] == ["old"]

        clock.t = T0 + 86400 + 180  # past keep_days
        s.add_sample(clock.t, {"b": 1.0})
        s.flush()
        assert rows(db, "SELECT MIN(m) FROM minutes")[0][0] * 60 >= clock.t - 86400 - 60
        assert s.events() == []
        assert sorted(j["id"] for j in s.rows()) == ["parked", "running"]
        # The series "a" left nothing behind and is gone; the others stay.
        assert {n for (n,) in rows(db, "SELECT name FROM series")} == {"b", "c"}


def test_history_chooses_raw_or_minute(db: Path, clock: Clock):
    clock.t = T0 + 30 * 3600
    with Store(db, raw_hours=24, clock=clock) as s:
        now = clock.t
        assert s.history(now - 3600, now)["resolution"] == "raw"
        assert s.history(now - 6 * 3600, now)["resolution"] == "raw"
        assert s.history(now - 6 * 3600 - 1, now)["resolution"] == "minute"
        assert s.history(now - 7 * 86400, now)["resolution"] == "minute"
        # Short, but older than the raw tier reaches.
        assert s.history(now - 25 * 3600, now - 24.5 * 3600)["resolution"] == "minute"
        h = s.history(now - 60, now)
        assert (h["start"], h["end"], h["series"]) == (now - 60, now, {})


def test_history_selects_series_by_name_and_prefix(store: Store):
    store.add_sample(T0, {"gpu0.used": 1.0, "gpu0.job.j1": 2.0, "gpu1.used": 3.0,
                          "mem.used": 4.0, "job.j1.rss": 5.0})
    store.flush()
    store.add_sample(T0 + 1, {"gpu0.other": 6.0})  # buffered only
    pick = lambda **kw: sorted(store.history(T0 - 1, T0 + 2, **kw)["series"])  # noqa: E731
    assert pick(series=["mem.used"]) == ["mem.used"]
    assert pick(prefix=["gpu0."]) == ["gpu0.job.j1", "gpu0.other", "gpu0.used"]
    assert pick(series=["job.j1.rss"], prefix=["gpu1."]) == ["gpu1.used", "job.j1.rss"]
    assert pick(series=["nope"]) == []
    assert len(pick()) == 6


def test_history_with_a_backwards_or_bad_range_is_empty(store: Store):
    store.add_sample(T0, {"a": 1.0})
    assert store.history(T0 + 10, T0)["series"] == {}
    assert store.history(float("nan"), T0)["series"] == {}
    assert store.history("x", T0)["series"] == {}  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Events and jobs


def test_job_records_round_trip_and_a_row_that_is_not_one_is_left_out(
        store: Store, db: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The store takes and returns job records; a row it cannot read into one (written by
    something else, or poisoned by an earlier engine) is left out and said, not raised."""
    rec = JobRecord(id="j1", name="mnist", state=S.RUNNING.value, started=T0, pid=42,
                    batch=64, notes=(Note("loss is not a number", "warn", T0),))
    store.save_job(rec)
    assert store.get_job("j1") == rec
    store.save_row({"id": "j2", "name": "odd", "state": "exploded", "started": T0 + 1})
    store.save_row({"id": "j3", "name": "deep", "state": "parked", "started": T0 + 2,
                    "notes": [{"level": "warn", "message": "\x1b]0;x\x07" * 3}]})
    with caplog.at_level(logging.WARNING, logger="headroom.jobs"):
        listed = store.list_jobs()
        assert store.get_job("j2") is None
    assert [r.id for r in listed] == ["j3", "j1"]
    assert "j2: its saved record cannot be read" in caplog.text
    assert all(n.message.isprintable() for n in listed[0].notes)
    assert [r.id for r in store.list_jobs(keep=lambda row: row["id"] == "j1")] == ["j1"]

def test_events_round_trip_and_are_written_at_once(store: Store, db: Path, clock: Clock):
    e = store.add_event("job_started", "Job j1 started", job_id="j1", data={"pid": 42})
    assert e.id is not None
    assert e == EngineEvent(T0, "job_started", "info", "Job j1 started", "j1", {"pid": 42}, e.id)
    assert rows(db, "SELECT kind, job_id FROM events") == [("job_started", "j1")]
    clock.t = T0 + 10
    store.add_event("guard_warn", "Memory is low", level="warn")
    store.add_event("job_paused", "Paused", job_id="j1", t=T0 + 20)
    assert store.events() == [
        e,
        EngineEvent(T0 + 10, "guard_warn", "warn", "Memory is low", None, None, e.id + 1),
        EngineEvent(T0 + 20, "job_paused", "info", "Paused", "j1", None, e.id + 2),
    ]
    assert [x.kind for x in store.events(job_id="j1")] == ["job_started", "job_paused"]
    assert [x.kind for x in store.events(since=T0 + 5)] == ["guard_warn", "job_paused"]
    assert [x.kind for x in store.events(until=T0 + 10)] == ["job_started", "guard_warn"]
    assert [x.kind for x in store.events(after_id=e.id)] == ["guard_warn", "job_paused"]
    # Without a starting point: the latest ones, still oldest first.
    assert [x.kind for x in store.events(limit=2)] == ["guard_warn", "job_paused"]
    # With one: the first ones from there, to page forward.
    assert [x.kind for x in store.events(after_id=0, limit=2)] == ["job_started", "guard_warn"]


def test_jobs_round_trip_upsert_and_order(store: Store):
    j1 = {"id": "j1", "name": "mnist", "state": "running", "pid": 10, "started": T0,
          "ended": None, "exit_code": None, "spec": {"script": "train.py", "gpus": [0]}}
    store.save_row(j1)
    store.save_row({"id": "j2", "name": "cifar", "state": "running", "started": T0 + 5})
    store.save_row({"id": "j0", "name": "queued", "state": "starting", "started": None})
    assert store.row("j1") == j1
    assert store.row("missing") is None
    assert [j["id"] for j in store.rows()] == ["j0", "j2", "j1"]
    store.save_row({**j1, "state": "exited", "ended": T0 + 60, "exit_code": 0})
    assert store.row("j1")["exit_code"] == 0
    assert [j["id"] for j in store.rows()] == ["j0", "j2", "j1"]
    assert [j["id"] for j in store.rows(include_finished=False)] == ["j0", "j2"]
    assert [j["id"] for j in store.rows(limit=1)] == ["j0"]
    store.save_row({"name": "no id"})  # logged, not raised
    assert len(store.rows()) == 3


# ---------------------------------------------------------------------------------------------
# Migrations

V1_SCHEMA = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version VALUES (1);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE series (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE samples (series_id INTEGER NOT NULL, t REAL NOT NULL, v REAL NOT NULL,
    PRIMARY KEY (series_id, t)) WITHOUT ROWID;
CREATE TABLE minutes (series_id INTEGER NOT NULL, m INTEGER NOT NULL, vmin REAL NOT NULL,
    vmean REAL NOT NULL, vmax REAL NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (series_id, m)) WITHOUT ROWID;
CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL,
    kind TEXT NOT NULL, level TEXT NOT NULL, message TEXT NOT NULL, job_id TEXT, data TEXT);
CREATE INDEX events_time ON events (time);
CREATE TABLE jobs (id TEXT PRIMARY KEY, name TEXT, state TEXT, started REAL,
    data TEXT NOT NULL);
CREATE INDEX jobs_started ON jobs (started);
"""


def test_a_version_1_database_is_migrated_and_keeps_its_data(db: Path, clock: Clock):
    conn = sqlite3.connect(str(db))
    conn.executescript(V1_SCHEMA)
    conn.execute("INSERT INTO series VALUES (1, 'mem.used')")
    conn.execute("INSERT INTO samples VALUES (1, ?, 5.0)", (T0 - 10,))
    conn.execute("INSERT INTO events (time, kind, level, message) VALUES (?, 'x', 'info', 'hi')",
                 (T0 - 5,))
    for job in ({"id": "old", "state": "exited", "started": T0 - 99, "ended": T0 - 50},
                {"id": "live", "state": "running", "started": T0 - 9, "ended": None}):
        conn.execute("INSERT INTO jobs VALUES (?, NULL, ?, ?, ?)",
                     (job["id"], job["state"], job["started"], json.dumps(job)))
    conn.commit()
    conn.close()

    with Store(db, clock=clock) as s:
        assert s.recovered_from is None
        assert rows(db, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
        assert s.history(T0 - 60, T0)["series"]["mem.used"] == {"t": [T0 - 10], "v": [5.0]}
        assert [e.message for e in s.events()] == ["hi"]
        assert [j["id"] for j in s.rows(include_finished=False)] == ["live"]
        assert rows(db, "SELECT id, ended, finished FROM jobs ORDER BY id") == [
            ("live", None, 0), ("old", T0 - 50, 1)]
    assert SCHEMA_VERSION == len(store_module.MIGRATIONS) >= 2


def test_a_database_from_a_newer_version_is_moved_aside(db: Path, clock: Clock):
    with Store(db, clock=clock):
        pass
    conn = sqlite3.connect(str(db))
    conn.execute("UPDATE schema_version SET version = 999")
    conn.commit()
    conn.close()
    with Store(db, clock=clock) as s:
        assert s.recovered_from is not None
        assert re.fullmatch(r"headroom\.db\.newer-\d{8}-\d{6}", s.recovered_from.name)
        assert rows(s.recovered_from, "SELECT version FROM schema_version") == [(999,)]
        assert [e.kind for e in s.events()] == ["store_recovered"]


# ---------------------------------------------------------------------------------------------
# Corrupt files


def _make_full_db(path: Path) -> None:
    with Store(path, clock=Clock()) as s:
        for i in range(2000):
            s.add_sample(T0 + i, {f"s{k}": float(i * k) for k in range(5)})
        s.add_event("x", "y")
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(64 * 1024))


def _truncated_header(path: Path) -> None:
    _make_full_db(path)
    data = path.read_bytes()
    path.write_bytes(data[:50])


def _truncated_half(path: Path) -> None:
    _make_full_db(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _malformed_schema(path: Path) -> None:
    _make_full_db(path)
    conn = sqlite3.connect(str(path))
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("UPDATE sqlite_master SET sql = 'CREATE TABLE events (' WHERE name = 'events'")
    conn.commit()
    conn.close()


def _foreign_schema(path: Path) -> None:
    # A current schema version, but a table without the columns the store uses.
    _make_full_db(path)
    conn = sqlite3.connect(str(path))
    conn.execute("DROP TABLE jobs")
    conn.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY)")
    conn.commit()
    conn.close()


@pytest.mark.parametrize(
    "damage", [_garbage, _truncated_header, _truncated_half, _malformed_schema, _foreign_schema]
)
def test_a_corrupt_file_is_moved_aside_and_a_new_one_made(db: Path, clock: Clock, damage, caplog):
    damage(db)
    damaged = db.read_bytes()
    with Store(db, clock=clock) as s:
        moved = s.recovered_from
        assert moved is not None and moved.parent == db.parent
        assert re.fullmatch(r"headroom\.db\.corrupt-\d{8}-\d{6}", moved.name)
        assert moved.read_bytes() == damaged  # kept as it was, for a look later
        [event] = s.events()
        assert (event.kind, event.level) == ("store_recovered", "warn")
        assert str(moved) in event.message
        # The new database works.
        s.add_sample(T0, {"a": 1.0})
        s.flush()
        s.save_row({"id": "j", "state": "running"})
        assert s.row("j") == {"id": "j", "state": "running"}
        assert s.write_error is None
    assert rows(db, "SELECT COUNT(*) FROM samples") == [(1,)]
    assert any(str(moved) in r.getMessage() for r in caplog.records)


def test_a_file_that_goes_corrupt_while_open_is_replaced(db: Path, clock: Clock):
    s = Store(db, clock=clock)
    try:
        for i in range(3000):
            s.add_sample(T0 + i, {f"s{k}": float(i) for k in range(5)})
        s.flush()
        other = sqlite3.connect(str(db))
        other.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = db.stat().st_size
        with open(db, "r+b") as f:  # the sample pages, past the first tables' roots
            f.seek(20 * 4096)
            f.write(os.urandom(size - 20 * 4096))
        # A commit from elsewhere makes the store drop its page cache and read the disk.
        other.execute("INSERT INTO meta (key, value) VALUES ('touched', '1')")
        other.commit()
        other.close()

        assert s.history(T0, T0 + 3000)["series"] == {}
        moved = s.recovered_from
        assert moved is not None and moved.exists()
        assert [(e.kind, str(moved) in e.message) for e in s.events()] == [
            ("store_recovered", True)]
        s.add_sample(T0 + 4000, {"a": 1.0})
        s.flush()
        assert s.history(T0 + 3999, T0 + 4001)["series"] == {"a": {"t": [T0 + 4000], "v": [1.0]}}
        assert s.write_error is None
    finally:
        s.close()


def test_an_empty_file_is_a_new_database_not_a_corrupt_one(db: Path, clock: Clock):
    db.write_bytes(b"")
    with Store(db, clock=clock) as s:
        assert s.recovered_from is None
        assert s.events() == []
    assert list(db.parent.glob("*.corrupt-*")) == []


def test_two_recoveries_in_one_second_keep_both_files(db: Path, clock: Clock):
    moved = []
    for _ in range(2):
        _garbage(db)
        with Store(db, clock=clock) as s:
            moved.append(s.recovered_from)
    assert moved[0] != moved[1] and all(p is not None and p.exists() for p in moved)


def test_a_path_that_cannot_be_opened_keeps_history_in_memory(tmp_path: Path, clock: Clock):
    blocker = tmp_path / "file"
    blocker.write_text("a file where a folder should be")
    with Store(blocker / "headroom.db", clock=clock) as s:
        assert s.write_error and "memory" in s.write_error
        assert s.recovered_from is None
        s.add_sample(T0, {"a": 1.0})
        s.flush()
        assert s.history(T0 - 1, T0 + 1)["series"]["a"]["v"] == [1.0]
        assert s.add_event("x", "y").id is not None
        assert s.write_error and "memory" in s.write_error
    assert blocker.read_text() == "a file where a folder should be"


def test_nothing_raises_after_close(store: Store):
    store.add_sample(T0, {"a": 1.0})
    store.close()
    store.add_sample(T0 + 1, {"a": 2.0})
    store.flush()
    assert store.add_event("x", "y").id is None
    store.save_row({"id": "j"})
    assert store.row("j") is None
    assert store.rows() == [] and store.events() == []
    assert store.history(T0 - 1, T0 + 2)["series"]["a"]["v"] == [2.0]  # still buffered
    store.close()


# ---------------------------------------------------------------------------------------------
# Disk full


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs Linux and root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(folder: Path) -> Path:
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return filler


def test_a_full_disk_keeps_a_bounded_buffer_and_says_so_once(
    small_tmpfs: Path, clock: Clock, caplog
):
    db = small_tmpfs / "headroom.db"
    s = Store(db, clock=clock)
    try:
        s.max_buffered_rows = 3000
        s.add_sample(T0, {"a": 0.0})
        s.flush()
        filler = _fill(small_tmpfs)
        caplog.clear()
        for i in range(1, 1001):
            s.add_sample(T0 + i, {f"s{k}": float(i) for k in range(10)})
            if i % 100 == 0:
                s.flush()  # never raises
        assert s.write_error is not None and "full" in s.write_error
        assert len(s._buf) <= 3000
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1, [r.getMessage() for r in errors]
        # The newest samples are kept, the oldest dropped.
        h = s.history(T0, T0 + 1000)["series"]["s0"]
        assert h["t"][-1] == T0 + 1000 and h["t"][0] > T0 + 1
        s.add_event("guard_warn", "written later")  # written now or by a later flush
        assert s.write_error is not None

        filler.unlink()
        s.flush()
        assert s.write_error is None
        assert s._buf == []
        on_disk = rows(db, "SELECT COUNT(*) FROM samples s JOIN series n ON n.id = s.series_id"
                           " WHERE n.name = 's0'")[0][0]
        assert on_disk == len(h["t"])
        assert [e.message for e in s.events()] == ["written later"]
    finally:
        s.close()


RLIMIT_SCRIPT = textwrap.dedent(
    """
    import json, os, resource, signal, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from trayapp.engine.store import Store

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    db = Path(sys.argv[1])
    t = [1_800_000_000.0]
    s = Store(db, clock=lambda: t[0])
    s.max_buffered_rows = 2000
    s.add_sample(t[0], {"a": 0.0})
    s.flush()
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    used = max(p.stat().st_size for p in db.parent.iterdir())
    resource.setrlimit(resource.RLIMIT_FSIZE, (used + 4096, hard))
    for i in range(1, 801):
        s.add_sample(t[0] + i, {"s%d" % k: float(i) for k in range(10)})
        if i % 100 == 0:
            s.flush()
    during = {"error": s.write_error, "buffered": len(s._buf)}
    resource.setrlimit(resource.RLIMIT_FSIZE, (1, hard))  # no write anywhere in any file
    event_id = s.add_event("guard_warn", "kept until it can be written").id
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    s.flush()
    after = {"error": s.write_error, "buffered": len(s._buf),
             "events": [(e.id, e.message) for e in s.events()]}
    s.close()
    print(json.dumps({"during": during, "event_id": event_id, "after": after}))
    """
)


def test_a_file_size_limit_is_a_write_error_not_a_crash(tmp_path: Path):
    try:
        import resource  # noqa: F401
    except ImportError:
        pytest.skip("no resource module (not a Unix system)")
    db = tmp_path / "headroom.db"
    r = subprocess.run([sys.executable, "-c", RLIMIT_SCRIPT, str(db), str(REPO)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["during"]["error"], out
    assert out["during"]["buffered"] <= 2000
    assert out["event_id"] is None
    assert out["after"] == {"error": None, "buffered": 0,
                            "events": [[1, "kept until it can be written"]]}
    assert rows(db, "SELECT COUNT(*) FROM samples")[0][0] > 1


# ---------------------------------------------------------------------------------------------
# Threads


def test_reads_from_other_threads_while_the_engine_writes(db: Path):
    clock = Clock()
    s = Store(db, clock=clock)
    stop = threading.Event()
    errors: List[BaseException] = []
    seen = {"history": 0, "events": 0}

    def writer() -> None:
        try:
            for i in range(3000):
                clock.t = T0 + i
                s.add_sample(T0 + i, {"mem.used": float(i), "gpu0.used": float(-i)})
                if i % 25 == 0:
                    s.flush()
                if i % 300 == 0:
                    s.add_event("tick", str(i))
                    s.save_row({"id": "j", "state": "running", "step": i})
        except BaseException as e:  # pragma: no cover - reported by the assert below
            errors.append(e)
        finally:
            stop.set()

    def history_reader() -> None:
        try:
            last = 0
            while not stop.is_set():
                h = s.history(T0, T0 + 3600, series=["mem.used"])
                ts = h["series"].get("mem.used", {"t": []})["t"]
                # Never a duplicate, never out of order, never less than a read before.
                assert all(a < b for a, b in zip(ts, ts[1:]))
                assert len(ts) >= last
                last = len(ts)
                seen["history"] += 1
        except BaseException as e:
            errors.append(e)

    def event_reader() -> None:
        try:
            after = 0
            while not stop.is_set():
                for e in s.events(after_id=after):
                    assert e.id > after
                    after = e.id
                assert s.row("j") is None or s.row("j")["state"] == "running"
                seen["events"] += 1
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=f) for f in (writer, history_reader, event_reader)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    s.close()
    assert not errors, errors
    assert seen["history"] > 0 and seen["events"] > 0
    assert rows(db, "SELECT COUNT(*) FROM samples")[0][0] == 6000
    assert rows(db, "SELECT COUNT(*) FROM events")[0][0] == 10
