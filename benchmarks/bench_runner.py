"""What the runner costs a Keras job, and how fast a cooperative pause takes hold.

The same small Keras fit runs as ``python script.py`` and under the runner (started from
``build_launch``'s plan, reporting to a listener like the engine's), alternately, several times;
the medians are compared: the fit time measured inside the script (wall clock, and the process's
CPU time, which other load on the machine disturbs less), and the whole process time; and, in one
process, the same fit with and without the runner's fit() hook (the hook's own cost, with less
noise than separate processes give). Goal: at most 1.03 times plain. Then one job under the
runner is paused and resumed again and again: the time from the pause request to the runner's
"paused" state, against the goal of at most one batch + 100 ms (the batch time is measured in
the same run, without the runner). A pause takes hold at the next batch: one asked for while
Keras sets up the next epoch's shuffled input waits for that too, which shows in the maximum.

    python benchmarks/bench_runner.py [--rounds 5] [--pauses 15] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Listener
from pathlib import Path
from typing import Any, Dict, List, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trayapp.jobs.options import JobSpec, MemoryOptions  # noqa: E402
from trayapp.jobs.plan import build_launch  # noqa: E402
from trayapp.runner import protocol  # noqa: E402

FIT_GOAL = 1.03
PAUSE_SLACK_S = 0.100

WORKLOAD = """
import json, sys, time
import numpy as np
import keras

out, samples, batch, epochs, units = sys.argv[1], *map(int, sys.argv[2:6])
keras.utils.set_random_seed(0)
x = np.random.default_rng(0).random((samples, 32), dtype=np.float32)
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(units, activation="relu"),
                          keras.layers.Dense(units, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
model.fit(x[:batch * 2], y[:batch * 2], epochs=1, batch_size=batch, verbose=0)  # trace, warm
start, cpu = time.perf_counter(), time.process_time()
model.fit(x, y, epochs=epochs, batch_size=batch, verbose=0)
fit_s, fit_cpu_s = time.perf_counter() - start, time.process_time() - cpu
with open(out, "w") as f:
    json.dump({"fit_s": fit_s, "fit_cpu_s": fit_cpu_s, "steps": epochs * (samples // batch)}, f)
"""

# The hook's own cost, without the noise of separate processes: in one process, the same fit
# with keras.Model.fit as Keras has it and as the runner patches it, alternately.
HOOK_AB = """
import json, statistics, sys, time
import numpy as np
import keras
sys.path.insert(0, sys.argv[1])
from trayapp.runner import fithook, job, tfoptions

rounds, samples, batch, units = map(int, sys.argv[2:6])
plain_fit = keras.Model.fit
session = job.Session(tfoptions.read_options(""), "bench", "bench")
fithook.install(keras, session)
hooked_fit = keras.Model.fit
x = np.random.default_rng(0).random((samples, 32), dtype=np.float32)
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(units, activation="relu"),
                          keras.layers.Dense(units, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
plain_fit(model, x[:batch * 2], y[:batch * 2], epochs=1, batch_size=batch, verbose=0)
times = {"plain": [], "hooked": []}
for i in range(rounds):
    pair = (("plain", plain_fit), ("hooked", hooked_fit))
    for name, fit in (pair if i % 2 == 0 else pair[::-1]):
        start = time.perf_counter()
        fit(model, x, y, epochs=1, batch_size=batch, verbose=0)
        times[name].append(time.perf_counter() - start)
print(json.dumps({k: statistics.median(v) for k, v in times.items()}))
"""


class EngineSide:
    """The engine's side of the job channel: collects messages, sends commands."""

    def __init__(self, folder: str) -> None:
        self.address = os.path.join(folder, "job.sock")
        self.keyfile = os.path.join(folder, "key")
        key = secrets.token_bytes(32)
        with open(self.keyfile, "wb") as f:
            f.write(key)
        self.listener = Listener(self.address, family="AF_UNIX", authkey=key)
        self.messages: queue.Queue = queue.Queue()
        self.conn: Any = None
        self.connected = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn = self.listener.accept()
            except OSError:
                return
            self.conn = conn
            self.connected.set()
            while True:
                try:
                    data = conn.recv_bytes()
                except (EOFError, OSError):
                    break
                self.messages.put((time.perf_counter(), protocol.decode(data)))

    def send(self, kind: str) -> float:
        sent = time.perf_counter()
        self.conn.send_bytes(protocol.encode(protocol.make(kind)))
        return sent

    def wait(self, kind: str, timeout: float = 60.0, **fields: Any) -> float:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {kind} message within {timeout} s")
            try:
                at, m = self.messages.get(timeout=left)
            except queue.Empty:
                continue
            if m["type"] == kind and all(m.get(k) == v for k, v in fields.items()):
                return at

    def close(self) -> None:
        self.listener.close()


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    env.update(CUDA_VISIBLE_DEVICES="-1", PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
    return env


def _run_plain(script: str, out: str, args: Sequence[str]) -> Dict[str, float]:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, script, out, *args],
        env=_env(),
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    total = time.perf_counter() - start
    return dict(json.loads(Path(out).read_text()), process_s=total)


def _runner_process(
    folder: str, script: str, out: str, args: Sequence[str], listener: EngineSide
) -> subprocess.Popen:
    spec = JobSpec(
        script=script,
        args=(out, *args),
        python=sys.executable,
        options=MemoryOptions(cpu_only=True),
    )
    plan = build_launch(
        spec,
        job_id="bench",
        address=listener.address,
        keyfile=listener.keyfile,
        base_env=_env(),
    )
    return subprocess.Popen(
        list(plan.argv),
        env=plan.env,
        cwd=plan.cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _run_runner(folder: str, script: str, out: str, args: Sequence[str]) -> Dict[str, float]:
    sub = tempfile.mkdtemp(dir=folder)
    listener = EngineSide(sub)
    try:
        start = time.perf_counter()
        proc = _runner_process(sub, script, out, args, listener)
        if proc.wait(600) != 0:
            raise RuntimeError(f"the job under the runner failed (exit {proc.returncode})")
        total = time.perf_counter() - start
        listener.wait(protocol.BYE, timeout=10)
    finally:
        listener.close()
    return dict(json.loads(Path(out).read_text()), process_s=total)


def _pause_latencies(folder: str, script: str, args: Sequence[str], pauses: int) -> List[float]:
    sub = tempfile.mkdtemp(dir=folder)
    listener = EngineSide(sub)
    out = os.path.join(sub, "pause.json")
    proc = _runner_process(sub, script, out, args, listener)
    latencies = []
    rng = random.Random(1)
    try:
        listener.wait(protocol.PROGRESS, timeout=120)
        for _ in range(pauses):
            time.sleep(rng.uniform(0.05, 0.25))  # a request lands anywhere within a batch
            sent = listener.send(protocol.PAUSE)
            latencies.append(listener.wait(protocol.STATE, state="paused") - sent)
            listener.send(protocol.RESUME)
            listener.wait(protocol.STATE, state="running")
        listener.send(protocol.STOP)
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        listener.close()
    return latencies


def run(rounds: int, pauses: int, quick: bool) -> Dict[str, Any]:
    folder = tempfile.mkdtemp(prefix="hr-bench-")
    try:
        script = os.path.join(folder, "workload.py")
        Path(script).write_text(WORKLOAD)
        # samples, batch, epochs, units: a fit of a few seconds of small batches.
        fit_args = ["8192", "32", "2", "128"] if quick else ["16384", "32", "3", "128"]
        # Larger batches for the pause test: a batch time nearer real training.
        pause_args = ["65536", "1024", "200", "512"]
        plain: List[Dict[str, float]] = []
        runner: List[Dict[str, float]] = []
        for i in range(rounds):
            out = os.path.join(folder, f"r{i}.json")
            # Alternate which goes first, so a drift in the machine's speed hits both alike.
            for under_runner in (False, True) if i % 2 == 0 else (True, False):
                if under_runner:
                    runner.append(_run_runner(folder, script, out, fit_args))
                else:
                    plain.append(_run_plain(script, out, fit_args))
        one_epoch = pause_args[:2] + ["1", pause_args[3]]
        batch = _run_plain(script, os.path.join(folder, "batch.json"), one_epoch)
        batch_s = batch["fit_s"] / batch["steps"]
        latencies = _pause_latencies(folder, script, pause_args, pauses)
        ab = subprocess.run(
            [sys.executable, "-c", HOOK_AB, str(Path(__file__).resolve().parents[1]),
             str(rounds * 2), *fit_args[:2], fit_args[3]],
            env=_env(), capture_output=True, text=True, check=True, timeout=600,
        )  # fmt: skip
        hook = json.loads(ab.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    def median(rows: List[Dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    return {
        "plain_fit_s": median(plain, "fit_s"),
        "runner_fit_s": median(runner, "fit_s"),
        "plain_fit_cpu_s": median(plain, "fit_cpu_s"),
        "runner_fit_cpu_s": median(runner, "fit_cpu_s"),
        "plain_process_s": median(plain, "process_s"),
        "runner_process_s": median(runner, "process_s"),
        "steps": plain[0]["steps"],
        "batch_s": batch_s,
        "pause_median_s": statistics.median(latencies),
        "pause_p90_s": sorted(latencies)[int(0.9 * (len(latencies) - 1))],
        "pause_max_s": max(latencies),
        "pauses": len(latencies),
        "hook_plain_s": hook["plain"],
        "hook_s": hook["hooked"],
        "rounds": rounds,
    }


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(description="Keras fit plain and under the runner; pause latency")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pauses", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="fewer rounds and a shorter fit")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rounds, pauses = (3, 8) if args.quick else (args.rounds, args.pauses)
    if rounds < 1 or pauses < 1:
        print("bench_runner: --rounds and --pauses must be at least 1", file=sys.stderr)
        return 2
    try:
        r = run(rounds, pauses, args.quick)
    except (OSError, RuntimeError, TimeoutError, subprocess.SubprocessError) as e:
        print(f"bench_runner: {e}", file=sys.stderr)
        return 1
    fit_ratio = r["runner_fit_s"] / r["plain_fit_s"]
    cpu_ratio = r["runner_fit_cpu_s"] / r["plain_fit_cpu_s"]
    hook_ratio = r["hook_s"] / r["hook_plain_s"]
    process_ratio = r["runner_process_s"] / r["plain_process_s"]
    pause_bound = r["batch_s"] + PAUSE_SLACK_S
    results = [
        {"name": "runner_fit", "value": round(r["runner_fit_s"], 3), "unit": "s",
         "ratio": round(fit_ratio, 3), "goal": FIT_GOAL},
        {"name": "runner_fit_cpu", "value": round(r["runner_fit_cpu_s"], 3), "unit": "s",
         "ratio": round(cpu_ratio, 3), "goal": FIT_GOAL},
        {"name": "runner_fit_hook_in_process", "value": round(r["hook_s"], 3), "unit": "s",
         "ratio": round(hook_ratio, 3), "goal": FIT_GOAL},
        {"name": "runner_process", "value": round(r["runner_process_s"], 3), "unit": "s",
         "ratio": round(process_ratio, 3), "goal": FIT_GOAL},
        {"name": "pause_latency_median", "value": round(r["pause_median_s"] * 1000, 1),
         "unit": "ms", "ratio": round(r["pause_median_s"] / pause_bound, 3), "goal": 1.0},
        {"name": "pause_latency_p90", "value": round(r["pause_p90_s"] * 1000, 1),
         "unit": "ms", "ratio": round(r["pause_p90_s"] / pause_bound, 3), "goal": 1.0},
        {"name": "pause_latency_max", "value": round(r["pause_max_s"] * 1000, 1), "unit": "ms",
         "ratio": round(r["pause_max_s"] / pause_bound, 3), "goal": 1.0},
        {"name": "batch_time", "value": round(r["batch_s"] * 1000, 1), "unit": "ms"},
    ]  # fmt: skip
    if args.json:
        print(json.dumps(results))
        return 0
    print(f"fit of {r['steps']} steps, median of {r['rounds']} alternating rounds")
    print(
        f"  fit inside the script: plain {r['plain_fit_s']:.3f} s, under the runner "
        f"{r['runner_fit_s']:.3f} s, ratio {fit_ratio:.3f} (goal <= {FIT_GOAL})"
    )
    print(
        f"  CPU time of the fit:   plain {r['plain_fit_cpu_s']:.3f} s, under the runner "
        f"{r['runner_fit_cpu_s']:.3f} s, ratio {cpu_ratio:.3f} (goal <= {FIT_GOAL})"
    )
    print(
        f"  the fit hook alone, in one process: plain {r['hook_plain_s']:.3f} s, hooked "
        f"{r['hook_s']:.3f} s, ratio {hook_ratio:.3f} (goal <= {FIT_GOAL})"
    )
    print(
        f"  whole process:         plain {r['plain_process_s']:.3f} s, under the runner "
        f"{r['runner_process_s']:.3f} s, ratio {process_ratio:.3f} (goal <= {FIT_GOAL})"
    )
    print(f"pause, request to paused, {r['pauses']} pauses: median "
          f"{r['pause_median_s'] * 1000:.1f} ms, p90 {r['pause_p90_s'] * 1000:.1f} ms, "
          f"max {r['pause_max_s'] * 1000:.1f} ms; "
          f"goal <= one batch ({r['batch_s'] * 1000:.1f} ms) + 100 ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
