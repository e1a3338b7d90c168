"""What the runner costs a Keras job, and how fast a cooperative pause takes hold.

The workload is issue 13's: a Dense 16-32-4 model, 512 samples, batch 32 (16 batches an epoch,
about 8 ms each on two cores), with one callback of the user's that reads each batch's loss (so
Keras runs every callback on the training thread, as it does for most users' callbacks). It runs
as ``python script.py``, under the runner alone (started from ``build_launch``'s plan, reporting
to a listener like the engine's) and under ``headroom run`` (a real engine, started once before),
the three in interleaved rounds whose order turns from round to round; each ratio is taken
within its round, and the report gives the median and the range over the rounds.

- The fit: from the end of its first batch (traced) to its return: wall clock, the process's
  CPU time, and the CPU time of the training thread (where the callbacks run). Goal: at most
  1.02 times plain.
- Before the first batch: from the moment the command is started to the first batch's begin,
  against the same for plain ``python``, split by time stamps into the client (``headroom run``
  until it has sent ``job_start``), the engine (from there to the job's process start, read from
  ``/proc``: the plan and the spawn; no interpreter probe runs on this path), the interpreter and
  the runner's bootstrap (process start to the script's first line), ``import keras`` with the
  runner's hooks on it, and ``fit()``'s start (its call to its first batch). Goal: at most
  0.3 s added. And after the script's last line, the time until the command returns.
- In one process, without the noise of separate processes: the same fit with and without the
  runner's fit() hook in alternating pairs (CPU time); what the runner's callbacks add to each
  batch in Keras's CallbackList; the import hooks' own time at ``import keras``; the hooked
  fit()'s start to its first batch against Keras's own.
- A pause: the time from the pause request to the runner's "paused" state, against one batch +
  100 ms (a pause takes hold at the next batch: one asked for while Keras sets up the next
  epoch's shuffled input waits for that too, which shows in the maximum).

Children run with compiled modules cached (PYTHONDONTWRITEBYTECODE removed), as an installed
Headroom and the user's packages do.

    python benchmarks/bench_runner.py [--rounds 9] [--pauses 15] [--quick] [--json]
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
from typing import Any, Callable, Dict, List, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trayapp.jobs.options import JobSpec, MemoryOptions  # noqa: E402
from trayapp.jobs.plan import build_launch  # noqa: E402
from trayapp.runner import protocol  # noqa: E402
from trayapp.runner.forecast import PROBE  # noqa: E402

FIT_GOAL = 1.02
START_GOAL_MS = 300.0
PAUSE_SLACK_S = 0.100
BATCHES = 16  # 512 samples in batches of 32

# The job: time stamps (time.time()) at its process start, its first line, after its imports,
# at fit() and at the first batch; then the fit after its first batch (wall and CPU).
WORKLOAD = """
import time
T_SCRIPT = time.time()
import json, os, sys


def process_start():
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rpartition(")")[2].split()[19])
    now, boot = time.time(), time.clock_gettime(time.CLOCK_BOOTTIME)
    return now - (boot - ticks / os.sysconf("SC_CLK_TCK"))


import numpy as np
import keras

T_IMPORTED = time.time()
out, epochs, samples, batch, units = sys.argv[1], *map(int, sys.argv[2:6])


class Losses(keras.callbacks.Callback):
    # The user's own callback: each batch's loss (not async-safe, as most are).
    def __init__(self):
        super().__init__()
        self.losses, self.first, self.traced = [], None, None

    def on_train_batch_begin(self, batch, logs=None):
        if self.first is None:
            self.first = time.time()

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))
        if self.traced is None:
            self.traced = (time.perf_counter(), time.process_time(), time.thread_time())


keras.utils.set_random_seed(0)
x = np.random.default_rng(0).random((samples, 16), dtype=np.float32)
y = np.random.default_rng(1).random((samples, 4), dtype=np.float32)
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(units, activation="relu"),
                          keras.layers.Dense(4)])
model.compile(optimizer="adam", loss="mse")
losses = Losses()
T_FIT = time.time()
model.fit(x, y, epochs=epochs, batch_size=batch, verbose=0, callbacks=[losses])
wall, cpu = time.perf_counter() - losses.traced[0], time.process_time() - losses.traced[1]
thread = time.thread_time() - losses.traced[2]
with open(out, "w") as f:
    json.dump({"spawn": process_start(), "script": T_SCRIPT, "imported": T_IMPORTED,
               "fit": T_FIT, "first_batch": losses.first, "fit_s": wall, "fit_cpu_s": cpu,
               "fit_thread_s": thread,
               "steps": len(losses.losses) - 1, "end": time.time()}, f)
"""

# ``headroom run`` with time stamps: the client's first line, when it has connected to the engine,
# when it sends job_start; the command itself is unchanged.
CLIENT = """
import time
t = {"client": time.time()}
import json, os, sys
from trayapp.engine import client

connect, job_start = client.connect, client.EngineClient.job_start


def timed_connect(*args, **kwargs):
    c = connect(*args, **kwargs)
    t["connected"] = time.time()
    return c


def timed_job_start(self, *args, **kwargs):
    t["sent"] = time.time()
    with open(os.environ["HEADROOM_BENCH_STAMPS"], "w") as f:
        json.dump(t, f)
    return job_start(self, *args, **kwargs)


client.connect, client.EngineClient.job_start = timed_connect, timed_job_start
from trayapp.cli import main

sys.exit(main(sys.argv[1:]))
"""

# The runner's own costs, without the noise of separate processes, in one process: the import
# hooks' time at ``import keras``; the same fit with keras.Model.fit as Keras has it and as the
# runner patches it, in alternating pairs, each with the user's per-batch callback (CPU time of
# the process); and what the runner's callbacks add to each batch in Keras's CallbackList.
HOOK_AB = """
import json, sys, time, timeit
sys.path.insert(0, sys.argv[1])
from trayapp.runner import fithook, hooks, job, tfoptions, training

rounds, epochs, samples, batch, units = map(int, sys.argv[2:7])
session = job.Session(tfoptions.read_options(""), "bench", "bench")
spent = {}


def timed(name, callback):
    def run(module):
        start = time.perf_counter()
        callback(module)
        spent[name] = time.perf_counter() - start
    return run


hooks.ImportWatcher({"tensorflow": timed("tensorflow", session.on_tensorflow),
                     "keras": timed("keras", session.on_keras)}).install()
import numpy as np
import keras

hooked_fit = keras.Model.fit
plain_fit = hooked_fit.__wrapped__


class Losses(keras.callbacks.Callback):
    first = None

    def on_train_batch_begin(self, batch, logs=None):
        if self.first is None:
            self.first = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.last = float(logs["loss"])


x = np.random.default_rng(0).random((samples, 16), dtype=np.float32)
y = np.random.default_rng(1).random((samples, 4), dtype=np.float32)
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(units, activation="relu"),
                          keras.layers.Dense(4)])
model.compile(optimizer="adam", loss="mse")
for fit in (plain_fit, hooked_fit):
    fit(model, x, y, epochs=1, batch_size=batch, verbose=0, callbacks=[Losses()])
ratios, starts = [], []
for i in range(rounds):
    pair, start = {}, {}
    for name, fit in (("plain", plain_fit), ("hooked", hooked_fit))[:: 1 if i % 2 else -1]:
        losses = Losses()
        cpu, called = time.process_time(), time.perf_counter()
        fit(model, x, y, epochs=epochs, batch_size=batch, verbose=0, callbacks=[losses])
        pair[name] = time.process_time() - cpu
        start[name] = losses.first - called
    ratios.append(pair["hooked"] / pair["plain"])
    starts.append(start["hooked"] - start["plain"])

progress_cls, first_cls = fithook._callback_classes(keras.callbacks, True)[:2]
run = training.FitRun(session, model, 1, 1, True, True)
run.steps = samples // batch
logs = model.get_metrics_result()


def steps(ours):
    callbacks = [first_cls(run), Losses(), progress_cls(run)] if ours else [Losses()]
    callback_list = keras.callbacks.CallbackList(callbacks, add_history=True, model=model)
    counter = [0]

    def step():
        n = counter[0] % run.steps
        counter[0] += 1
        callback_list.on_train_batch_begin(n)
        callback_list.on_train_batch_end(n, logs)
    return step


best = {False: float("inf"), True: float("inf")}
stepper = {ours: steps(ours) for ours in best}
for _ in range(20):
    for ours in best:
        best[ours] = min(best[ours], timeit.timeit(stepper[ours], number=2000) / 2000)
print(json.dumps({"ratios": ratios, "hooks_s": sum(spent.values()),
                  "fit_start_s": sorted(starts)[len(starts) // 2],
                  "callbacks_s": best[True] - best[False]}))
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
                message = protocol.decode(data)
                self.messages.put((time.perf_counter(), message))
                if message.get("type") == protocol.FORECAST and message.get("how") == PROBE:
                    # --fit-batch's question, answered as an engine with room does: the
                    # accumulation it probed (the runner would wait for an answer otherwise).
                    k = message.get("accumulation") or 1
                    conn.send_bytes(protocol.encode(protocol.make(protocol.FIT, accumulation=k)))

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


def _env(**extra: str) -> Dict[str, str]:
    env = dict(os.environ)
    # Compiled modules are cached, as for an installed Headroom and the user's packages: else
    # each start compiles the runner's and the client's modules again.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(CUDA_VISIBLE_DEVICES="-1", PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
    env.update(extra)
    return env


def _result(out: str, started: float, process_s: float) -> Dict[str, float]:
    r = json.loads(Path(out).read_text())
    return dict(r, started=started, process_s=process_s)


def _run_plain(script: str, out: str, args: Sequence[str]) -> Dict[str, float]:
    started, start = time.time(), time.perf_counter()
    subprocess.run([sys.executable, script, out, *args], env=_env(), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return _result(out, started, time.perf_counter() - start)


def _plan(script: str, out: str, args: Sequence[str], listener: EngineSide) -> Any:
    spec = JobSpec(script=script, args=(out, *args), python=sys.executable,
                   options=MemoryOptions(cpu_only=True))
    return build_launch(spec, job_id="bench", address=listener.address,
                        keyfile=listener.keyfile, base_env=_env())


def _spawn(plan: Any) -> subprocess.Popen:
    return subprocess.Popen(list(plan.argv), env=plan.env, cwd=plan.cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _run_runner(folder: str, script: str, out: str, args: Sequence[str]) -> Dict[str, float]:
    """Under the runner alone; the plan is made before the clock starts (the engine's part is
    measured under ``headroom run``)."""
    sub = tempfile.mkdtemp(dir=folder)
    listener = EngineSide(sub)
    plan = _plan(script, out, args, listener)
    try:
        started, start = time.time(), time.perf_counter()
        proc = _spawn(plan)
        if proc.wait(600) != 0:
            raise RuntimeError(f"the job under the runner failed (exit {proc.returncode})")
        total = time.perf_counter() - start
        listener.wait(protocol.BYE, timeout=10)
    finally:
        listener.close()
    return _result(out, started, total)


class Engine:
    """A real engine on its own state folder, started once; ``run`` is ``headroom run``."""

    def __init__(self, folder: str) -> None:
        self.home = os.path.join(folder, "home")
        os.makedirs(self.home)
        self.stamps = os.path.join(folder, "client.json")
        self.env = _env(HEADROOM_HOME=self.home, HEADROOM_BENCH_STAMPS=self.stamps,
                        PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen([sys.executable, "-m", "trayapp", "engine", "--stay"],
                                     env=self.env, cwd=str(REPO), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while subprocess.run([sys.executable, "-m", "trayapp", "status"], env=self.env,
                             cwd=str(REPO), capture_output=True).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the engine did not start")
            time.sleep(0.2)

    def run(self, script: str, out: str, args: Sequence[str]) -> Dict[str, float]:
        started, start = time.time(), time.perf_counter()
        done = subprocess.run([sys.executable, "-c", CLIENT, "run", script, out, *args],
                              env=self.env, cwd=os.path.dirname(script),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"headroom run failed (exit {done.returncode}): {last}")
        r = _result(out, started, time.perf_counter() - start)
        r.update({k: v for k, v in json.loads(Path(self.stamps).read_text()).items()})
        return r

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _pause_latencies(folder: str, script: str, args: Sequence[str], pauses: int) -> List[float]:
    sub = tempfile.mkdtemp(dir=folder)
    listener = EngineSide(sub)
    out = os.path.join(sub, "pause.json")
    proc = _spawn(_plan(script, out, args, listener))
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


VARIANTS = ("plain", "runner", "headroom")
# Where the time before the first batch goes: (part, from stamp, to stamp); a part missing from
# a variant counts as nothing there.
PARTS = (
    ("client", "started", "sent"),
    ("engine", "sent", "spawn"),
    ("interpreter and bootstrap", "spawn", "script"),
    ("import keras (hooks)", "script", "imported"),
    ("the script's model", "imported", "fit"),
    ("fit() to its first batch", "fit", "first_batch"),
)


def _parts(r: Dict[str, float]) -> Dict[str, float]:
    """Seconds of each part of the time before the first batch of one run."""
    out = {}
    stamps = dict(r)
    stamps.setdefault("sent", stamps["started"])
    for part, a, b in PARTS:
        out[part] = stamps[b] - stamps[a]
    return out


def _rounds(rounds: int, run_one: Dict[str, Callable[[str], Dict[str, float]]],
            folder: str) -> List[Dict[str, Dict[str, float]]]:
    rows = []
    for i in range(rounds):
        row = {}
        # The order turns each round, so a drift in the machine's speed hits all alike.
        order = VARIANTS[i % 3:] + VARIANTS[:i % 3]
        for name in order:
            row[name] = run_one[name](os.path.join(folder, f"r{i}-{name}.json"))
        rows.append(row)
    return rows


def _spread(values: Sequence[float]) -> Tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def summarize(rows: List[Dict[str, Dict[str, float]]]) -> Dict[str, Any]:
    """Ratios and start-up differences against plain, each taken within its round."""
    s: Dict[str, Any] = {"rounds": len(rows), "steps": rows[0]["plain"]["steps"]}
    for name in ("runner", "headroom"):
        for key in ("fit_s", "fit_cpu_s", "fit_thread_s", "process_s"):
            s[f"{name}_{key}"] = _spread([r[name][key] / r["plain"][key] for r in rows])
        added = [(r[name]["first_batch"] - r[name]["started"])
                 - (r["plain"]["first_batch"] - r["plain"]["started"]) for r in rows]
        s[f"{name}_start"] = _spread(added)
        parts = [(_parts(r[name]), _parts(r["plain"])) for r in rows]
        s[f"{name}_parts"] = {part: statistics.median(a[part] - p[part] for a, p in parts)
                              for part, _, _ in PARTS}
        s[f"{name}_end"] = statistics.median(
            (r[name]["started"] + r[name]["process_s"] - r[name]["end"])
            - (r["plain"]["started"] + r["plain"]["process_s"] - r["plain"]["end"]) for r in rows)
    for key in ("fit_s", "fit_cpu_s", "process_s"):
        s[f"plain_{key}"] = statistics.median(r["plain"][key] for r in rows)
    s["plain_start"] = statistics.median(r["plain"]["first_batch"] - r["plain"]["started"]
                                         for r in rows)
    client = [(r["headroom"]["connected"] - r["headroom"]["client"],
               r["headroom"]["sent"] - r["headroom"]["connected"]) for r in rows]
    s["client_connect"] = statistics.median(c[0] for c in client)
    s["client_after_connect"] = statistics.median(c[1] for c in client)
    return s


def run(rounds: int, pauses: int, quick: bool) -> Dict[str, Any]:
    folder = tempfile.mkdtemp(prefix="hr-bench-")
    engine = None
    try:
        script = os.path.join(folder, "workload.py")
        Path(script).write_text(WORKLOAD)
        # epochs, samples, batch, units: issue 13's fit of batches of about 8 ms.
        fit_args = ["10" if quick else "20", "512", "32", "32"]
        engine = Engine(folder)
        runs: Dict[str, Callable[[str], Dict[str, float]]] = {
            "plain": lambda out: _run_plain(script, out, fit_args),
            "runner": lambda out: _run_runner(folder, script, out, fit_args),
            "headroom": lambda out: engine.run(script, out, fit_args),  # type: ignore[union-attr]
        }
        for name, run_one in runs.items():  # the page cache and compiled modules, once
            run_one(os.path.join(folder, f"warm-{name}.json"))
        s = summarize(_rounds(rounds, runs, folder))
        engine.close()
        engine = None
        # Larger batches for the pause test: a batch time nearer real training.
        pause_args = ["200", "65536", "1024", "512"]
        batch = _run_plain(script, os.path.join(folder, "batch.json"), ["1", *pause_args[1:]])
        s["batch_s"] = batch["fit_s"] / batch["steps"]
        latencies = _pause_latencies(folder, script, pause_args, pauses)
        ab = subprocess.run(
            [sys.executable, "-c", HOOK_AB, str(REPO), str(rounds * 2), *fit_args],
            env=_env(), capture_output=True, text=True, check=True, timeout=900,
        )
        own = json.loads(ab.stdout.strip().splitlines()[-1])
        s["hook"] = _spread(own["ratios"])
        s["hooks_s"], s["callbacks_s"] = own["hooks_s"], own["callbacks_s"]
        s["fit_start_s"] = own["fit_start_s"]
    finally:
        if engine is not None:
            engine.close()
        shutil.rmtree(folder, ignore_errors=True)
    s["pauses"] = len(latencies)
    s["pause_median_s"] = statistics.median(latencies)
    s["pause_p90_s"] = sorted(latencies)[int(0.9 * (len(latencies) - 1))]
    s["pause_max_s"] = max(latencies)
    return s


WHERE = {"runner": "the runner alone", "headroom": "headroom run"}


def results(s: Dict[str, Any]) -> List[Dict[str, Any]]:
    n = s["rounds"]
    out: List[Dict[str, Any]] = []

    def ratio(name: str, what: str, spread: Tuple[float, float, float], goal: float) -> None:
        med, low, high = spread
        out.append({"name": f"{what} under {WHERE[name]}, against plain python (median of {n} "
                            f"rounds, range {low:.3f}-{high:.3f})",
                    "value": round(med, 3), "unit": "x", "goal": goal,
                    "ratio": round(med / goal, 3)})

    for name in ("headroom", "runner"):
        ratio(name, f"the fit ({s['steps']} batches of "
                    f"{s['plain_fit_s'] / s['steps'] * 1000:.1f} ms), wall", s[f"{name}_fit_s"],
              FIT_GOAL)
        ratio(name, "the fit, CPU time of the process", s[f"{name}_fit_cpu_s"], FIT_GOAL)
        ratio(name, "the fit, CPU time of the training thread (where the callbacks run)",
              s[f"{name}_fit_thread_s"], FIT_GOAL)
    med, low, high = s["hook"]
    out.append({"name": f"the fit hook alone, in one process, CPU time (median of "
                        f"{2 * n} pairs, range {low:.3f}-{high:.3f})",
                "value": round(med, 3), "unit": "x", "goal": FIT_GOAL,
                "ratio": round(med / FIT_GOAL, 3)})
    batch_s = s["plain_fit_s"] / s["steps"]
    added = 1 + s["callbacks_s"] / batch_s
    out.append({"name": f"the runner's callbacks on each batch in Keras's CallbackList: "
                        f"{s['callbacks_s'] * 1e6:.2f} us (best of 20) on a batch of "
                        f"{batch_s * 1000:.1f} ms", "value": round(added, 5), "unit": "x",
                "goal": FIT_GOAL, "ratio": round(added / FIT_GOAL, 4)})
    out.append({"name": "the runner's import hooks (TensorFlow options, the fit() patch), at "
                        "import keras", "value": round(s["hooks_s"] * 1000, 1), "unit": "ms"})
    out.append({"name": "the runner's fit() wrapper and first callbacks, fit() to its first "
                        "batch, in one process (median of the pairs)",
                "value": round(s["fit_start_s"] * 1000, 1), "unit": "ms"})
    for name in ("headroom", "runner"):
        med, low, high = s[f"{name}_start"]
        out.append({"name": f"added before the first batch, {WHERE[name]} (median of {n} "
                            f"rounds, range {low * 1000:.0f}-{high * 1000:.0f} ms)",
                    "value": round(med * 1000, 1), "unit": "ms", "goal": START_GOAL_MS,
                    "ratio": round(med * 1000 / START_GOAL_MS, 3)})
        for part, value in s[f"{name}_parts"].items():
            out.append({"name": f"  of it, {part} ({WHERE[name]})",
                        "value": round(value * 1000, 1), "unit": "ms"})
    ratio("headroom", "the whole process", s["headroom_process_s"], FIT_GOAL)
    for name in ("headroom", "runner"):
        out.append({"name": f"added after the script's end until the command returns, "
                            f"{WHERE[name]} (median)",
                    "value": round(s[f"{name}_end"] * 1000, 1), "unit": "ms"})
    pause_bound = s["batch_s"] + PAUSE_SLACK_S
    for key, what in (("median", "median"), ("p90", "p90"), ("max", "max")):
        value = s[f"pause_{key}_s"]
        out.append({"name": f"pause_latency_{what}", "value": round(value * 1000, 1),
                    "unit": "ms", "ratio": round(value / pause_bound, 3), "goal": 1.0})
    out.append({"name": "batch_time (pause test)", "value": round(s["batch_s"] * 1000, 1),
                "unit": "ms"})
    return out


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(description="Keras fit plain and under the runner; pause latency")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--pauses", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="fewer rounds and a shorter fit")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rounds, pauses = (3, 8) if args.quick else (args.rounds, args.pauses)
    if rounds < 1 or pauses < 1:
        print("bench_runner: --rounds and --pauses must be at least 1", file=sys.stderr)
        return 2
    try:
        s = run(rounds, pauses, args.quick)
    except (OSError, RuntimeError, TimeoutError, subprocess.SubprocessError) as e:
        print(f"bench_runner: {e}", file=sys.stderr)
        return 1
    items = results(s)
    if args.json:
        print(json.dumps(items))
        return 0
    print(f"plain python: the fit {s['plain_fit_s']:.3f} s ({s['steps']} batches), "
          f"{s['plain_start'] * 1000:.0f} ms to its first batch, the process "
          f"{s['plain_process_s']:.2f} s")
    print(f"headroom run's client: {s['client_connect'] * 1000:.0f} ms to connect, "
          f"{s['client_after_connect'] * 1000:.0f} ms more to send job_start")
    for r in items:
        goal = f"  (goal {r['goal']})" if "goal" in r else ""
        print(f"{r['name']}: {r['value']} {r['unit']}{goal}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
