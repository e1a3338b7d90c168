"""A Jupyter kernel as a guarded job, for real: ``headroom kernel install`` writes the spec,
jupyter_client's KernelManager starts the kernel from it, cells train a small Keras model on
tensorflow-cpu, and the engine adopts, pauses, interrupts and watches it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import psutil
import pytest

jupyter_client = pytest.importorskip("jupyter_client")
from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from jupyter_client.manager import KernelManager  # noqa: E402

from tests.conftest import EngineProcess, end_processes_of, run_cli, wait_for  # noqa: E402
from trayapp.config import get_paths  # noqa: E402
from trayapp.engine.client import EngineClient, EngineError  # noqa: E402
from trayapp.runner.protocol import STOP_EXIT_CODE  # noqa: E402

MODEL = """
import numpy as np, keras, time
class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.03)
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32"); y = (x.sum(axis=1) > 0).astype("float32")
def make():
    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
    m.compile(optimizer="adam", loss="binary_crossentropy")
    return m
model = make()
"""
EPOCHS = 20
FIT = "history = model.fit(x, y, epochs={epochs}, batch_size=8, verbose=0, callbacks=[Slow()])"


def install_spec(home: Path, prefix: Path, name: str, *flags: str) -> None:
    done = run_cli("kernel", "install", "--prefix", str(prefix), "--name", name, *flags,
                   env={"HEADROOM_HOME": str(home)})
    assert done.returncode == 0, done.stderr


def start_kernel(prefix: Path, name: str, notebook: str) -> Tuple[KernelManager, Any]:
    ksm = KernelSpecManager(kernel_dirs=[str(prefix / "share" / "jupyter" / "kernels")])
    km = KernelManager(kernel_name=name, kernel_spec_manager=ksm)
    km.start_kernel(env={**os.environ, "JPY_SESSION_NAME": notebook})
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    return km, kc


def close(km: KernelManager, kc: Any) -> None:
    kc.stop_channels()
    if km.is_alive():
        km.shutdown_kernel(now=True)
    km.cleanup_resources()
    km.context.destroy(linger=0)  # its sockets, before warnings-as-errors sees them go


def run(kc: Any, code: str, timeout: float = 120) -> Tuple[Dict[str, Any], str]:
    """Run a cell; (its reply's content, what it printed)."""
    out: List[str] = []

    def hook(msg: Dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    return reply["content"], "".join(out)


def value(kc: Any, expr: str) -> str:
    content, text = run(kc, f"print({expr})")
    assert content["status"] == "ok", content
    return text.strip()


def get_paths_of(home: Path) -> Any:
    old = os.environ.get("HEADROOM_HOME")
    os.environ["HEADROOM_HOME"] = str(home)
    try:
        return get_paths()
    finally:
        if old is not None:
            os.environ["HEADROOM_HOME"] = old


def kernel_job(client: EngineClient, pid: int) -> Dict[str, Any]:
    return next((j for j in client.request("jobs") if j.get("pid") == pid), {})


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Any]]:
    root = tmp_path_factory.mktemp("kernel")
    home = root / "home"
    home.mkdir(mode=0o700)
    prefix = root / "prefix"
    checkpoints = root / "checkpoints"
    install_spec(home, prefix, "hr", "--threads", "2,1", "--precision", "mixed_bfloat16",
                 "--checkpoint-dir", str(checkpoints))
    old = os.environ.get("HEADROOM_HOME")
    os.environ["HEADROOM_HOME"] = str(home)
    paths = get_paths()
    engine = EngineProcess(paths).wait_ready()
    km, kc = start_kernel(prefix, "hr", str(root / "train.ipynb"))
    try:
        yield {"home": home, "paths": paths, "engine": engine, "km": km, "kc": kc,
               "prefix": prefix, "root": root, "checkpoints": checkpoints}
    finally:
        close(km, kc)
        engine.stop()
        end_processes_of(home)
        if old is None:
            os.environ.pop("HEADROOM_HOME", None)
        else:
            os.environ["HEADROOM_HOME"] = old


@pytest.fixture(scope="module")
def client(setup: Dict[str, Any]) -> Iterator[EngineClient]:
    with EngineClient(setup["paths"]) as c:
        yield c


def test_options_are_applied_before_the_first_cell(setup: Dict[str, Any]) -> None:
    kc = setup["kc"]
    assert value(kc, "__import__('tensorflow').config.threading."
                     "get_intra_op_parallelism_threads()") == "2"
    assert value(kc, "__import__('tensorflow').config.threading."
                     "get_inter_op_parallelism_threads()") == "1"
    assert value(kc, "__import__('keras').config.dtype_policy().name") == "mixed_bfloat16"


def test_the_kernel_is_a_job_named_after_its_notebook(setup: Dict[str, Any],
                                                      client: EngineClient) -> None:
    pid = setup["km"].provisioner.pid
    job = wait_for(lambda: kernel_job(client, pid).get("connected") and kernel_job(client, pid),
                   30, "the kernel's job")
    assert job["kind"] == "kernel" and job["name"] == "train.ipynb"
    shown = run_cli("jobs", env={"HEADROOM_HOME": str(setup["home"])})
    assert shown.returncode == 0 and "train.ipynb" in shown.stdout, shown.stdout


def test_headroom_logs_says_a_kernels_output_is_in_its_notebook(setup: Dict[str, Any],
                                                                client: EngineClient) -> None:
    job = wait_for(lambda: kernel_job(client, setup["km"].provisioner.pid), 30, "the kernel")
    done = run_cli("logs", job["id"], env={"HEADROOM_HOME": str(setup["home"])})
    assert done.returncode == 0 and done.stdout == "", done.stdout
    assert "Jupyter kernel" in done.stderr and "notebook" in done.stderr, done.stderr


def test_pause_resume_and_interrupt_a_fit(setup: Dict[str, Any], client: EngineClient) -> None:
    kc, pid = setup["kc"], setup["km"].provisioner.pid
    run(kc, MODEL + "marker = 'kept'")
    msg_id = kc.execute(FIT.format(epochs=EPOCHS))
    job = wait_for(lambda: (kernel_job(client, pid).get("step") or 0) > 2
                   and kernel_job(client, pid), 60, "progress of the fit")
    assert job["epochs"] == EPOCHS
    paused = client.request("job_action", job=job["id"], action="pause")
    assert paused["state"] == "paused" and paused["pause_mode"] == "cooperative", paused
    step = kernel_job(client, pid)["step"]
    resumed = client.request("job_action", job=job["id"], action="resume")
    assert resumed["state"] == "running"
    wait_for(lambda: kernel_job(client, pid).get("step") != step, 30, "training again")

    done = run_cli("park", job["id"], env={"HEADROOM_HOME": str(setup["home"])})
    assert done.returncode == 0, done.stdout + done.stderr
    reply = kc.get_shell_msg(timeout=60)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert "checkpoint" in reply["content"]["evalue"]
    assert "or you (Interrupt fit, headroom park)" in reply["content"]["evalue"]
    after = wait_for(lambda: kernel_job(client, pid).get("state") == "running"
                     and kernel_job(client, pid), 30, "the kernel running again")
    assert after["checkpoint"]["path"].startswith(str(setup["checkpoints"]))
    shown = run_cli("jobs", env={"HEADROOM_HOME": str(setup["home"])}).stdout
    assert "idle (last fit: epoch" in shown, shown  # not as if the fit went on
    assert value(kc, "marker") == "kept"
    # The command says what happened to the fit, not only the state the kernel is back in.
    said = done.stdout.strip()
    assert said.startswith(f"kernel {job['id']} (") and "fit" in said and "interrupt" in said, said
    assert "checkpoint" in said and "kernel and its variables are kept" in said or \
        "at the next batch end" in said, said
    events = client.request("events", job=job["id"])
    assert any(e["kind"] == "job_interrupted" and "GPU memory" in e["message"] for e in events)
    setup["interrupted_at"] = after["checkpoint"]["epoch"]
    setup["checkpoint"] = after["checkpoint"]["path"]


def test_a_later_fit_of_the_same_model_resumes_from_its_checkpoint(setup: Dict[str, Any]) -> None:
    kc = setup["kc"]
    assert os.path.isdir(setup["checkpoint"])
    # A model made again (as after a restart: new layer names) and fit with the same arguments;
    # a callback of its own counts the epochs this cell trains.
    seen = ("seen = []\nclass Seen(keras.callbacks.Callback):\n"
            "    def on_epoch_begin(self, epoch, logs=None):\n        seen.append(epoch)\n")
    content, printed = run(kc, seen + "model = make()\n" + FIT.format(epochs=EPOCHS).replace(
        "callbacks=[Slow()]", "callbacks=[Seen()]"), timeout=300)
    assert content["status"] == "ok", content
    # The cell says why Keras starts at a later epoch, and trains from there only.
    start = setup["interrupted_at"]
    said = f"goes on from its checkpoint at epoch {start + 1} "
    assert said in printed, printed
    assert value(kc, "seen") == str(list(range(start, EPOCHS)))
    # Its History is the whole training's, as an uninterrupted fit's: the epochs trained
    # before the interrupt come from the checkpoint.
    assert value(kc, "history.epoch") == str(list(range(EPOCHS)))
    assert int(value(kc, "len(history.history['loss'])")) == EPOCHS
    assert not os.path.exists(setup["checkpoint"])  # done: the cell run again trains afresh


def test_an_idle_kernel_is_suspended_at_once(setup: Dict[str, Any], client: EngineClient) -> None:
    pid = setup["km"].provisioner.pid
    job = kernel_job(client, pid)
    paused = client.request("job_action", job=job["id"], action="pause")
    assert paused["state"] == "paused" and paused["pause_mode"] == "suspended", paused
    client.request("job_action", job=job["id"], action="resume")
    assert value(setup["kc"], "1 + 1") == "2"
    with pytest.raises(EngineError, match="nothing to interrupt"):
        client.request("job_action", job=job["id"], action="park")


def test_adopt_requests_that_lie_are_refused(setup: Dict[str, Any],
                                             client: EngineClient) -> None:
    before = len(client.request("jobs"))
    for pid in (1, os.getpid(), setup["km"].provisioner.pid, 2**31 - 1):
        with pytest.raises(EngineError):
            client.request("kernel_adopt", pid=pid, name="x")
    for bad in ({"pid": "1"}, {"pid": 1.5}, {"pid": 1, "kernel": [1]}, {"pid": 1, "evil": 1}):
        with pytest.raises(EngineError):
            client.request("kernel_adopt", **bad)
    assert len(client.request("jobs")) == before
    assert client.request("status")["guard"]["state"] in ("ok", "warn", "pause", "park")


def test_a_garbled_channel_does_not_cost_the_kernel_its_job(setup: Dict[str, Any],
                                                            client: EngineClient) -> None:
    from multiprocessing.connection import Client

    job = kernel_job(client, setup["km"].provisioner.pid)
    key = (setup["paths"].jobs_dir / job["id"] / "key").read_bytes()
    conn = Client(setup["paths"].job_address(job["id"]), authkey=key)
    for junk in (b"\xff\x00", b"[]", b'{"type": "state", "state": "idle", "x": ' + b"[" * 50):
        conn.send_bytes(junk)
    conn.close()
    wait_for(lambda: kernel_job(client, job["pid"]).get("dropped_fields"), 10, "the drops")
    assert value(setup["kc"], "marker") == "kept"
    assert kernel_job(client, job["pid"])["state"] == "running"


def test_a_process_cannot_claim_a_kernel_it_is_not(setup: Dict[str, Any]) -> None:
    """A process holding the key names the kernel's pid (the right command line): refused, the
    engine asks the socket who is asking."""
    pid = setup["km"].provisioner.pid
    code = ("import sys; from trayapp.engine.client import EngineClient, EngineError\n"
            "from trayapp.config import get_paths\n"
            "try:\n    EngineClient(get_paths()).request('kernel_adopt', pid=int(sys.argv[1]))\n"
            "except EngineError as e:\n    print('refused:', e)\n")
    done = subprocess.run([sys.executable, "-c", code, str(pid), "--kernel"],
                          env={**os.environ, "HEADROOM_HOME": str(setup["home"])},
                          capture_output=True, text=True, timeout=60)
    assert "refused:" in done.stdout and "not the one asking" in done.stdout, \
        done.stdout + done.stderr


SELF_ADOPT = """
import os, sys, time
from trayapp.config import get_paths
from trayapp.engine.client import EngineClient
print(EngineClient(get_paths()).request('kernel_adopt', pid=os.getpid(), name='x')['job'],
      flush=True)
time.sleep(120)
"""


def test_a_process_that_only_says_kernel_is_a_job_of_itself_and_stops_as_one(
        setup: Dict[str, Any], client: EngineClient) -> None:
    """Any process of the user whose command line has "--kernel" can make itself a kernel job
    (it is the user's own, as ``headroom run`` would make it): the engine acts on the asking
    process only, and a stop of it that no runner answers ends it with signals."""
    proc = subprocess.Popen([sys.executable, "-c", SELF_ADOPT, "--kernel"],
                            env={**os.environ, "HEADROOM_HOME": str(setup["home"])},
                            stdout=subprocess.PIPE, text=True)
    try:
        job_id = (proc.stdout.readline() if proc.stdout else "").strip()
        job = client.request("job_get", job=job_id)
        assert job["kind"] == "kernel" and job["pid"] == proc.pid and not job["connected"]
        with pytest.raises(EngineError, match="nothing to interrupt"):
            client.request("job_action", job=job_id, action="park")
        stopped = client.request("job_action", job=job_id, action="stop")
        assert stopped["state"] == "stopped", stopped
        assert proc.wait(timeout=10) != 0
        assert client.request("status")["guard"]["state"] in ("ok", "warn", "pause", "park")
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout:
            proc.stdout.close()


def test_a_kernel_shut_down_by_jupyter_ends_its_job(setup: Dict[str, Any],
                                                    client: EngineClient) -> None:
    km = setup["km"]
    pid = km.provisioner.pid
    job_id = kernel_job(client, pid)["id"]
    km.shutdown_kernel()
    ended = wait_for(lambda: next((j for j in client.request("jobs", all=True)
                                   if j["id"] == job_id and j["state"] in
                                   ("finished", "failed", "lost", "stopped")), None),
                     30, "the job's end")
    assert ended["state"] == "finished", ended


def test_headroom_stop_ends_a_kernel_that_has_not_imported_keras(setup: Dict[str, Any],
                                                                 client: EngineClient) -> None:
    """The last resort on a kernel: the runner ends it at once (no SIGINT that ipykernel would
    take as a cell's interrupt, no wait for SIGTERM); Jupyter sees the kernel gone."""
    km, kc = start_kernel(setup["prefix"], "hr", "")
    try:
        pid = km.provisioner.pid
        job = wait_for(lambda: kernel_job(client, pid).get("connected") and kernel_job(client, pid),
                       30, "the kernel's job")
        assert not job["hooked"]
        worker = int(value(kc, "__import__('subprocess').Popen(['sleep', '300']).pid"))
        wait_for(lambda: worker in kernel_job(client, pid).get("pids", ()), 30,
                 "the engine to see the kernel's worker")
        done = run_cli("stop", job["id"], env={"HEADROOM_HOME": str(setup["home"])})
        assert done.returncode == 0, done.stdout + done.stderr
        said = done.stdout.strip()
        assert said.startswith(f"kernel {job['id']} ({job['name']}): stopped by you; "), said
        assert "shut down" in said and "variables are lost" in said, said
        wait_for(lambda: not km.is_alive(), 10, "Jupyter to see the kernel gone")
        ended = next(j for j in client.request("jobs", all=True) if j["id"] == job["id"])
        assert ended["state"] == "stopped" and ended["stopped_by"] == "user", ended
        # The runner ended it (signals would leave the exit status unknown: Jupyter's child).
        assert ended["exit_code"] == STOP_EXIT_CODE, ended
        wait_for(lambda: not psutil.pid_exists(worker) or psutil.Process(worker).status()
                 == psutil.STATUS_ZOMBIE, 15, "the kernel's worker to end with it")
    finally:
        close(km, kc)


def test_a_kernel_without_an_engine_registers_when_one_starts(setup: Dict[str, Any]) -> None:
    home = setup["root"] / "home2"
    home.mkdir(mode=0o700)
    prefix = setup["root"] / "prefix2"
    install_spec(home, prefix, "hr2", "--threads", "3,1")
    km, kc = start_kernel(prefix, "hr2", "")
    engine = None
    try:
        assert value(kc, "__import__('tensorflow').config.threading."
                         "get_intra_op_parallelism_threads()") == "3"
        paths = get_paths_of(home)
        engine = EngineProcess(paths).wait_ready()
        pid = km.provisioner.pid
        with EngineClient(paths) as c:
            job = wait_for(lambda: kernel_job(c, pid).get("connected") and kernel_job(c, pid),
                           30, "the kernel registering")
            # No notebook named by Jupyter: the kernel spec's display name and its start time,
            # never the temporary connection file's name.
            spec = json.loads((prefix / "share" / "jupyter" / "kernels" / "hr2" /
                               "kernel.json").read_text())
            assert job["kind"] == "kernel" and re.fullmatch(
                re.escape(spec["display_name"]) + r" \d\d:\d\d", job["name"]), job["name"]
            assert Path(km.connection_file).stem not in job["name"]
            os.kill(pid, signal.SIGKILL)
            ended = wait_for(lambda: next((j for j in c.request("jobs", all=True)
                                           if j["id"] == job["id"] and j["state"] == "lost"),
                                          None), 30, "the killed kernel's job to end")
            assert "exit status unknown" in ended["end_reason"]
            assert c.request("status")["guard"] is not None
    finally:
        close(km, kc)
        if engine is not None:
            engine.stop()
        end_processes_of(home)
