"""What Headroom's kernel spec costs a notebook: the kernel's start, and a cell's fit().

Two kernel specs of the same interpreter in one temporary Jupyter folder: ipykernel's own
(``python -m ipykernel_launcher -f {connection_file}``) and Headroom's (``headroom kernel
install``: the runner, the options, registering with a real engine started once before). In
interleaved rounds whose order turns from round to round, jupyter_client's KernelManager starts
each kernel and times:

- the start: from ``start_kernel`` to the reply of a first executed cell (``1``);
- a cell's fit: a Dense 8-16-1 model, 512 samples, batch 16, timed inside the cell around
  ``fit()`` (the first fit of the kernel, Keras's compile and trace included).

Each ratio is Headroom's median over plain's median, both from this run. Goals: the start at
most 1.1 times plain, the fit at most 1.05.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CELL = """
import time, numpy as np, keras
x = np.random.default_rng(0).normal(size=(512, 8)).astype("float32"); y = x[:, :1] > 0
m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                      keras.layers.Dense(1, activation="sigmoid")])
m.compile(optimizer="adam", loss="binary_crossentropy")
t = time.perf_counter(); m.fit(x, y, epochs={epochs}, batch_size=16, verbose=0)
print(time.perf_counter() - t)
"""


def plain_spec(prefix: Path) -> None:
    folder = prefix / "share" / "jupyter" / "kernels" / "plain"
    folder.mkdir(parents=True)
    (folder / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "plain", "language": "python"}))


def one_kernel(prefix: Path, name: str, epochs: int) -> Tuple[float, float]:
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    ksm = KernelSpecManager(kernel_dirs=[str(prefix / "share" / "jupyter" / "kernels")])
    km = KernelManager(kernel_name=name, kernel_spec_manager=ksm)
    started = time.perf_counter()
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        kc.execute_interactive("1", timeout=120, output_hook=lambda m: None)  # nothing printed
        start = time.perf_counter() - started
        out: List[str] = []
        kc.execute_interactive(CELL.format(epochs=epochs), timeout=600, output_hook=lambda m:
                               out.append(m["content"]["text"]) if m["msg_type"] == "stream"
                               else None)
        fit = float("".join(out).strip().splitlines()[-1])
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        km.context.destroy(linger=0)
    return start, fit


def measure(rounds: int, epochs: int) -> List[Dict[str, Any]]:
    from tests.conftest import EngineProcess
    from trayapp.config import get_paths

    root = Path(tempfile.mkdtemp(prefix="bench-kernel-"))
    home = root / "home"
    home.mkdir(mode=0o700)
    os.environ["HEADROOM_HOME"] = str(home)
    prefix = root / "prefix"
    subprocess.run([sys.executable, "-m", "trayapp", "kernel", "install", "--prefix",
                    str(prefix), "--name", "headroom"], check=True,
                   cwd=str(REPO), capture_output=True)
    plain_spec(prefix)
    engine = EngineProcess(get_paths()).wait_ready()
    times: Dict[str, Dict[str, List[float]]] = {k: {"start": [], "fit": []}
                                                for k in ("plain", "headroom")}
    try:
        for i in range(rounds):
            for name in (("plain", "headroom") if i % 2 == 0 else ("headroom", "plain")):
                start, fit = one_kernel(prefix, name, epochs)
                times[name]["start"].append(start)
                times[name]["fit"].append(fit)
    finally:
        engine.stop()
    out = []
    for what, goal, label in (("start", 1.1, "kernel start to a first executed cell"),
                              ("fit", 1.05, f"a cell's first fit() ({epochs} epochs)")):
        plain = statistics.median(times["plain"][what])
        ours = statistics.median(times["headroom"][what])
        out.append({"name": f"{label}, Headroom's spec against ipykernel's (median of "
                            f"{rounds})", "value": round(ours, 3), "unit": "s",
                    "baseline": round(plain, 3), "ratio": round(ours / plain, 3),
                    "goal": goal})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="2 rounds, 3 epochs")
    a = ap.parse_args()
    rounds, epochs = (2, 3) if a.quick else (a.rounds, a.epochs)
    results = measure(rounds, epochs)
    if a.json:
        print(json.dumps(results, indent=1))
    else:
        for r in results:
            print(f"{r['name']}: {r['value']} s against {r['baseline']} s, ratio {r['ratio']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
