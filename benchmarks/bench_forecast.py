"""The forecast's error against the measured peak, and which way of shrinking gives host memory
back.

1. Issue 23's cases, none a multiple of its batch: a fit whose host memory grows with its batch
   (one Dense(32768) layer on 64 features, as in ``tests/scripts/runner/wide_fit.py``), a small
   CNN with Adam, a metric and ``validation_split``, and a small MLP whose memory is nearly all
   TensorFlow's own. Each runs in fresh processes with the runner's fit() hook installed as in a
   job (no engine connected; its messages are kept): at the full batch (the first steps'
   forecast), with --fit-batch answered "the full batch" (the probe's forecast) and answered "2
   micro-batches" (the first steps at half the batch). Each forecast is compared with the peak
   resident memory (the kernel's VmHWM) of the job it forecasts, as that job ran: ratio =
   forecast / measured peak; goal: from 1 (never low) to 1.15 (at most 15% high).
2. Host memory after shrinking in the same process against a fresh process at the smaller
   micro-batch, with TensorFlow's default oneDNN kernels and without them: in-process shrinking
   gives host memory back only when oneDNN does not keep it, which is why the guard relaunches a
   job over its RAM budget instead of shrinking it in place.

    python benchmarks/bench_forecast.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]
MiB = 2**20

SCRIPT = r"""
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import keras
sys.path.insert(0, sys.argv[1])
from trayapp.runner import fithook, forecast, job, shrink, tfoptions

case, mode, batch = sys.argv[2], sys.argv[3], int(sys.argv[4])
rng = np.random.default_rng(0)
keras.utils.set_random_seed(0)
if case == "wide":  # host memory that grows with the batch (tests/scripts/runner/wide_fit.py)
    x = rng.random((8000, 64), dtype=np.float32)
    y = x[:, :1] * 2.0
    m = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32768, activation="relu"),
                          keras.layers.Dense(1)])
    m.compile(optimizer=keras.optimizers.SGD(0.001), loss="mse")
    kw = dict(epochs=2)
elif case == "cnn":  # a small CNN with Adam, a metric and validation_split
    x = rng.random((6000, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, 6000)
    m = keras.Sequential([keras.Input((28, 28, 1)),
                          keras.layers.Conv2D(32, 3, activation="relu"),
                          keras.layers.MaxPooling2D(),
                          keras.layers.Conv2D(64, 3, activation="relu"),
                          keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")])
    m.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    kw = dict(epochs=2, validation_split=0.1)
else:  # "small": TensorFlow's own memory is nearly all of it
    x = rng.random((1000, 16), dtype=np.float32)
    y = rng.integers(0, 4, 1000)
    m = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(4)])
    m.compile(optimizer="adam",
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    kw = dict(epochs=3)
out = {}
if mode.startswith(("steps", "probe")):
    # As in a job (no engine connected; its messages kept); probeK: --fit-batch, answered K.
    k = int(mode[5:] or 0) if mode.startswith("probe") else 0
    session = job.Session(dict(tfoptions.DEFAULTS, fit_batch=bool(k)))
    sent = []
    session.send = sent.append
    if k:
        session.ask_fit = lambda message, timeout: (sent.append(message), k)[1]
    fithook.install(keras, session)
    m.fit(x, y, batch_size=batch, verbose=0, shuffle=False, **kw)
    out["forecasts"] = [s for s in sent if s.get("type") == "forecast"]
    out["peak"] = forecast.host_read()[1]
elif mode == "peak":
    m.fit(x, y, batch_size=batch, verbose=0, shuffle=False, **kw)
    out["peak"] = forecast.host_read()[1]
else:  # "inprocess": the full batch, then micro-batches of half of it in the same process
    m.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False)
    out["full"] = forecast.host_read()[1]
    shrink.set_accumulation(keras, m.optimizer, 2)
    m.train_function = None
    shrink.release_memory()
    forecast.host_reset()
    m.fit(x, y, batch_size=batch // 2, epochs=1, verbose=0, shuffle=False)
    out["shrunk"] = forecast.host_read()[1]
print(json.dumps(out))
"""


def run(mode: str, batch: int, case: str = "wide", onednn: bool = True) -> Dict[str, Any]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    if not onednn:
        env["TF_ENABLE_ONEDNN_OPTS"] = "0"
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(REPO), case, mode, str(batch)],
                       capture_output=True, text=True, timeout=1800, env=env)
    if r.returncode != 0:
        raise SystemExit(f"bench_forecast: the {case} {mode} workload failed: "
                         f"{r.stderr.strip()[-500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def predicted(found: Dict[str, Any], how: str, batch: int, micro: int = 0) -> float:
    """The host's forecast ``how`` of ``found`` (the one measured at ``micro``, when given)
    at micro-batches of ``batch``."""
    from trayapp.runner.forecast import need

    message = next(f for f in found["forecasts"] if f["how"] == how
                   and (not micro or f["micro_batch"] == micro))
    ram = next(d for d in message["devices"] if d["device"] == "ram")
    k = message["batch"] // batch  # the accumulation at this micro-batch (its accumulators)
    accumulators = sum(a["bytes"] for a in message["accumulators"] if a["device"] == "ram")
    return float(need(ram, batch, k, accumulators))


# (case, batch): none of the datasets is a multiple of its batch
CASES = (("wide", 4096), ("cnn", 512), ("small", 32))
GOAL_LOW, GOAL_HIGH = 1.0, 1.15  # never low, at most 15% high


def figure(name: str, forecast: float, peak: float) -> Dict[str, Any]:
    ratio = forecast / peak
    return {"name": f"{name}: forecast {forecast / MiB:.0f} MiB / measured peak "
                    f"{peak / MiB:.0f} MiB (error {100 * (ratio - 1):+.1f} %)",
            "value": round(ratio, 3), "unit": "x", "goal": GOAL_HIGH, "goal_min": GOAL_LOW}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results: List[Dict[str, Any]] = []
    for case, batch in CASES[:1] if args.quick else CASES:
        half = batch // 2
        plain = run("steps", batch, case)  # trains at the batch, measured in its first steps
        probed = run("probe1", batch, case)  # --fit-batch, answered: the full batch
        shrunk = run("probe2", batch, case)  # --fit-batch, answered: micro-batches of half
        results += [
            figure(f"{case}, batch {batch}: the first steps' forecast",
                   predicted(plain, "steps", batch), plain["peak"]),
            figure(f"{case}, batch {batch}: --fit-batch's probe forecast",
                   predicted(probed, "probe", batch), probed["peak"]),
            figure(f"{case}, batch {batch}: --fit-batch's probe forecast at {half} x 2",
                   predicted(probed, "probe", half), shrunk["peak"]),
            figure(f"{case}, batch {batch}: the first steps' forecast at {half} x 2",
                   predicted(shrunk, "steps", half, half), shrunk["peak"]),
            figure(f"{case}, batch {batch}: the first steps at {half} x 2, forecast at "
                   f"{batch}", predicted(shrunk, "steps", batch, half), probed["peak"]),
        ]
    for onednn in (True, False):
        kept = run("inprocess", 4096, "wide", onednn)
        fresh = run("peak", 2048, "wide", onednn)["peak"]
        label = "oneDNN on (TensorFlow's default)" if onednn else "oneDNN off"
        results.append({"name": f"host peak after shrinking 4096 -> 2048 x 2 in the same process "
                                f"/ a fresh process at 2048 ({label}; full batch "
                                f"{kept['full'] / MiB:.0f} MiB)",
                        "value": round(kept["shrunk"] / fresh, 3), "unit": "x"})
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for r in results:
            print(f"{r['name']}: {r['value']} {r['unit']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
