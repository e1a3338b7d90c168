"""What shrinking costs: the time from an out-of-memory error in fit() to the next trained step,
the training speed at the shrunk micro-batch against the full batch, and what the atomic step
(no variable updated before every gradient of the step exists) costs every shrinkable job.

All in one process with the runner's fit() hook installed as in a job (no engine connected),
on tensorflow-cpu; the out-of-memory error is raised by a callback at a chosen batch, so the
time measured is Headroom's (releasing memory, re-tracing the train step for the new optimizer,
dropping the micro-batches already trained), not the allocator's.

    python benchmarks/bench_shrink.py [--rounds 5] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]

ATOMIC_GOAL = 1.02  # the atomic step: at most 2% slower than Keras's own step

SCRIPT = r"""
import json, os, statistics, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import keras
import tensorflow as tf
sys.path.insert(0, sys.argv[1])
from trayapp.runner import fithook, job, shrink, tfoptions

rounds, samples, batch, units = map(int, sys.argv[2:6])
x = np.random.default_rng(0).random((samples, 64), dtype=np.float32)
y = x.sum(axis=1, keepdims=True)


def model():
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((64,)), keras.layers.Dense(units, activation="relu"),
                          keras.layers.Dense(units, activation="relu"), keras.layers.Dense(1)])
    m.compile(optimizer="adam", loss="mse")
    return m


def timed(fit, m, **kw):
    start = time.perf_counter()
    fit(m, x, y, epochs=1, verbose=0, shuffle=False, **kw)
    return time.perf_counter() - start


plain_fit = keras.Model.fit
out = {}

# 1. the atomic step, plain Keras fit on both models, alternately
plain, atomic = model(), model()
shrink.make_atomic(tf, atomic.optimizer)
for m in (plain, atomic):
    plain_fit(m, x[:batch * 2], y[:batch * 2], batch_size=batch, epochs=1, verbose=0)
t = {"plain": [], "atomic": []}
for i in range(rounds):
    pair = (("plain", plain), ("atomic", atomic))
    for name, m in (pair if i % 2 == 0 else pair[::-1]):
        t[name].append(timed(plain_fit, m, batch_size=batch))
out["atomic_ratio"] = statistics.median(t["atomic"]) / statistics.median(t["plain"])
out["step_ms"] = statistics.median(t["plain"]) / (samples // batch) * 1000

# 2. samples per second: the full batch against micro-batches of half with accumulation 2
full, half = model(), model()
shrink.set_accumulation(keras, half.optimizer, 2)
for m, b in ((full, batch), (half, batch // 2)):
    plain_fit(m, x[:batch * 2], y[:batch * 2], batch_size=b, epochs=1, verbose=0)
t = {"full": [], "half": []}
for i in range(rounds):
    pair = (("full", full, batch), ("half", half, batch // 2))
    for name, m, b in (pair if i % 2 == 0 else pair[::-1]):
        t[name].append(timed(plain_fit, m, batch_size=b))
out["samples_per_s_full"] = samples / statistics.median(t["full"])
out["samples_per_s_half"] = samples / statistics.median(t["half"])

# 3. from an out-of-memory error to the next trained step, under the runner's hook
session = job.Session(tfoptions.read_options(""), "bench", "bench")
fithook.install(keras, session)
raise_at = (samples // batch) // 2
seen = {}


class Oom(keras.callbacks.Callback):
    def on_train_batch_begin(self, b, logs=None):
        if "raised" not in seen and b == raise_at:
            seen["raised"] = time.perf_counter()
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating (bench)")

    def on_train_batch_end(self, b, logs=None):
        # The restarted epoch drops the micro-batches already trained; the next trained one is
        # micro-batch raise_at * 2.
        if "raised" in seen and "next" not in seen and b == raise_at * 2:
            seen["next"] = time.perf_counter()


m = model()
keras.Model.fit(m, x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=[Oom()])
out["oom_to_next_step_s"] = seen["next"] - seen["raised"]
print(json.dumps(out))
"""


def run(rounds: int, samples: int, batch: int, units: int) -> Dict[str, float]:
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(REPO), str(rounds), str(samples),
                        str(batch), str(units)], capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"bench_shrink: the workload failed: {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rounds = 3 if args.quick else args.rounds
    samples, batch, units = (4096, 64, 256) if args.quick else (8192, 64, 256)
    got = run(rounds, samples, batch, units)
    results: List[Dict[str, Any]] = [
        {"name": f"atomic step against Keras's own (batch {batch}, "
                 f"{got['step_ms']:.1f} ms a step; median of {rounds})",
         "value": round(got["atomic_ratio"], 3), "unit": "x", "goal": ATOMIC_GOAL,
         "ratio": round(got["atomic_ratio"] / ATOMIC_GOAL, 3)},
        {"name": f"samples per second, micro-batches of {batch // 2} x 2 against batch {batch}",
         "value": round(got["samples_per_s_half"] / got["samples_per_s_full"], 3), "unit": "x"},
        {"name": f"samples per second at batch {batch}", "value": round(got["samples_per_s_full"]),
         "unit": "samples/s"},
        {"name": "out-of-memory error to the next trained step (release, re-trace, skip)",
         "value": round(got["oom_to_next_step_s"], 3), "unit": "s"},
    ]
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for r in results:
            print(f"{r['name']}: {r['value']} {r['unit']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
