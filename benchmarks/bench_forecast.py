"""The forecast's error against the measured peak, and which way of shrinking gives host memory
back.

1. A fit whose host memory grows with its batch (one Dense(32768) layer on 64 features, as in
   ``tests/scripts/runner/wide_fit.py``) runs in a fresh process at each batch size, with the
   runner's fit() hook installed as in a job (no engine connected; its messages are kept): the
   forecast measured in the first steps at one batch size predicts the peak at the others, and
   --fit-batch's probe (two steps at a sixteenth of the batch) predicts them before training; each
   prediction is compared with the peak resident memory measured at that batch (the kernel's
   VmHWM over a whole epoch, in a process of its own). Ratio = forecast / measured: above 1 errs
   toward a smaller micro-batch, below 1 toward one that does not fit.
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

mode, batch, samples = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
x = np.random.default_rng(0).random((samples, 64), dtype=np.float32)
y = x[:, :1] * 2.0
keras.utils.set_random_seed(0)
m = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32768, activation="relu"),
                      keras.layers.Dense(1)])
m.compile(optimizer=keras.optimizers.SGD(0.001), loss="mse")
out = {}

if mode in ("steps", "probe"):
    options = dict(tfoptions.DEFAULTS, fit_batch=mode == "probe")
    session = job.Session(options)
    sent = []
    session.send = sent.append
    fithook.install(keras, session)
    m.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False)
    kind = forecast.PROBE if mode == "probe" else forecast.STEPS
    found = [s for s in sent if s.get("type") == "forecast" and s.get("how") == kind]
    out["devices"] = found[0]["devices"] if found else []
elif mode == "peak":
    m.fit(x[:batch * 2], y[:batch * 2], batch_size=batch, epochs=1, verbose=0)  # traced
    forecast.host_reset()
    m.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False)
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


def run(mode: str, batch: int, samples: int, onednn: bool = True) -> Dict[str, Any]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    if not onednn:
        env["TF_ENABLE_ONEDNN_OPTS"] = "0"
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(REPO), mode, str(batch),
                        str(samples)], capture_output=True, text=True, timeout=1800, env=env)
    if r.returncode != 0:
        raise SystemExit(f"bench_forecast: the {mode} workload failed: "
                         f"{r.stderr.strip()[-500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def predicted(devices: List[Dict[str, Any]], batch: int) -> float:
    ram = next(d for d in devices if d["device"] == "ram")
    return float(ram["fixed_bytes"] + ram["per_sample_bytes"] * batch)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    samples = 8192
    base, targets = (1024, (2048, 4096)) if not args.quick else (1024, (4096,))
    sizes = sorted({base, *targets})
    peaks = {b: run("peak", b, samples)["peak"] for b in sizes}
    steps = run("steps", base, samples)["devices"]
    probe = run("probe", max(targets), samples)["devices"]
    results: List[Dict[str, Any]] = []
    for b in targets:
        results.append({"name": f"forecast from the first steps at batch {base} / measured "
                                f"peak at batch {b} ({peaks[b] / MiB:.0f} MiB)",
                        "value": round(predicted(steps, b) / peaks[b], 3), "unit": "x"})
    for b in sizes:
        results.append({"name": f"--fit-batch's probe forecast / measured peak at batch {b}",
                        "value": round(predicted(probe, b) / peaks[b], 3), "unit": "x"})
    for onednn in (True, False):
        kept = run("inprocess", 4096, samples, onednn)
        fresh = run("peak", 2048, samples, onednn)["peak"]
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
