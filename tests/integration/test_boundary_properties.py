"""Property-based attacks on both channels of a real engine, asserting more than "it answers":
after a batch of hostile examples (deep nesting, huge numbers, long strings with control
characters, wrong types, unknown keys), a bounded hog launched by the test is still paused by
the guard at its budget.

- Every job message type, sent on a running job's channel with its key (what any job's script
  can do), and the job's record still reads back.
- Every control request op, each answered ``bad_request`` or ``refused``, never ``internal``.

One engine per test. The hog: 50 MiB chunks at 100 MiB/s up to 600 MiB, under a 300 MiB
budget; ended in a ``finally``.
"""

from __future__ import annotations

import contextlib
import json
import threading
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any, Dict, List

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import REPO, EngineProcess, suspended, wait_for
from trayapp.engine.client import EngineClient
from trayapp.engine.protocol import REQUESTS
from trayapp.jobs.runner_link import MAX_FIT_ANSWERS
from trayapp.runner import protocol as rp

SCRIPTS = REPO / "tests" / "scripts"
HOG = str(SCRIPTS / "guard" / "hog.py")
TICKER = str(SCRIPTS / "jobs" / "ticker.py")

EXAMPLES = settings(max_examples=40, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow, HealthCheck.data_too_large])


# -- JSON text with what json.dumps will not write ------------------------------------------------


class Raw:
    """JSON text put in as it is: a value nested deeper than json.dumps goes, NaN, 1e400."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return f"Raw({self.text[:40]!r}{'...' if len(self.text) > 40 else ''})"


class Long(Raw):
    """A long text (its repr stays short)."""

    def __init__(self, char: str, n: int):
        super().__init__(json.dumps(char * n))
        self.char, self.n = char, n

    def __repr__(self) -> str:
        return f"Long({self.char!r} * {self.n})"


def to_text(value: Any) -> str:
    """``value`` as JSON text, with ``Raw`` parts as they are."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join((k.text if isinstance(k, Long) else json.dumps(str(k))) + ":"
                              + to_text(v) for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(to_text(v) for v in value) + "]"
    return json.dumps(value)


def _deep(depth: int, kind: str) -> Raw:
    if kind == "list":
        return Raw("[" * depth + "]" * depth)
    if kind == "object":
        return Raw('{"a":' * depth + "0" + "}" * depth)
    return Raw('[{"device":' * depth + '"x"' + "}]" * depth)  # a tf_memory inside a tf_memory


deep = st.builds(_deep, st.integers(50, 3000) | st.sampled_from([600, 100_000]),
                 st.sampled_from(["list", "object", "tf_memory"]))
huge = (st.integers(min_value=2**53, max_value=2**300) | st.integers(max_value=-(2**53),
                                                                      min_value=-(2**300))
        | st.sampled_from([Raw("1e400"), Raw("-1e400"), Raw("NaN"), Raw("Infinity"),
                           1e308, -1e308, 2**63, 2**64, -(2**63) - 1]))
nasty_text = (st.text(max_size=50)
              | st.text(alphabet=st.characters(max_codepoint=0x9f), min_size=100, max_size=5000)
              | st.sampled_from(["\x1b[2J\x1b[31mred", "a\r\nb", "\x00\x07\x08", "\u202e",
                                 ])
              | st.builds(Long, st.sampled_from(["x", "\x1b", "\n", "\u202e"]),
                          st.integers(1000, 150_000)))
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | nasty_text
plain_values = st.recursive(scalars, lambda children: st.lists(children, max_size=5)
                            | st.dictionaries(nasty_text, children, max_size=5), max_leaves=20)
nasty = plain_values | deep | huge

# The fields each message type has (as the runner sends them), plus some it has not.
JOB_FIELDS: Dict[str, List[str]] = {
    rp.HELLO: ["job_id", "pid", "python", "python_version", "script", "runner_version",
               "options", "applied", "tf_version", "keras_version", "tf_imported",
               "build_info", "tf_devices", "fit_hook", "hooked", "state", "error"],
    rp.PROGRESS: ["fit", "epoch", "epochs", "step", "steps", "logs", "tf_memory", "batch",
                  "micro_batch", "accumulation", "shrinkable"],
    rp.STATE: ["state", "epoch", "step"],
    rp.CHECKPOINTED: ["path", "epoch", "step", "fit", "reason"],
    rp.NOTE: ["level", "message", "topic"],
    rp.FORECAST: ["fit", "how", "batch", "micro_batch", "accumulation", "devices",
                  "accumulators"],
    rp.BYE: ["reason", "exit_code"],
}
assert set(JOB_FIELDS) == rp.JOB_MESSAGES
# Forecasts of the right shape with hostile numbers: the engine computes with them.
sizes = st.integers(0, 2**62) | huge | st.integers(max_value=-1)
forecast_devices = st.lists(st.fixed_dictionaries({
    "device": st.sampled_from(["ram", "GPU:0", "GPU:9"]) | nasty_text, "fixed_bytes": sizes,
    "per_sample_bytes": sizes, "peak_bytes": sizes, "measured_batch": sizes}), max_size=20)
SHAPED = {"devices": forecast_devices,
          "batch": st.integers(0, 2**53) | huge, "accumulation": st.integers(0, 2**12) | huge,
          "how": st.sampled_from(["steps", "probe"]) | nasty_text}


@st.composite
def job_messages(draw: Any) -> Dict[str, Any]:
    kind = draw(st.sampled_from(sorted(rp.JOB_MESSAGES)))
    names = draw(st.lists(st.sampled_from(JOB_FIELDS[kind]) | nasty_text, max_size=6,
                          unique=True))
    msg: Dict[str, Any] = {name: draw(SHAPED.get(name, nasty) | nasty) if kind == rp.FORECAST
                           else draw(nasty) for name in names}
    msg["type"] = kind
    return msg


def _control_arg(types: tuple, typed: bool) -> Any:
    """A value of the right type (so the handler runs and judges it), or a nasty one."""
    right: List[Any] = []
    if int in types:
        right.append(st.integers(-5, 10**12))
    if float in types:
        right.append(st.floats(-1e12, 2e9))
    if str in types:
        right.append(nasty_text)
    if bool in types:
        right.append(st.booleans())
    if list in types:
        right.append(st.lists(nasty_text, max_size=4))
    if dict in types:
        right.append(st.dictionaries(nasty_text, nasty, max_size=6))
    if typed and right:
        return st.one_of(*right)
    return st.one_of(*right, nasty) if right else nasty


# Valid requests that legitimately end the engine or turn the guard off: not attacks.
SAFE_CONFIG_NAMES = ["ui.notifications", "history.keep_days", "guard.budget_warn_percent",
                     "guard.no_such_setting", "no.such", ""]


@st.composite
def control_requests(draw: Any) -> Dict[str, Any]:
    op = draw(st.sampled_from(sorted(REQUESTS)) if draw(st.integers(0, 9)) else nasty_text)
    spec = REQUESTS.get(op, {})
    typed = draw(st.booleans())  # half the requests well typed: their handlers judge them
    args: Dict[str, Any] = {}
    for name, (types, required) in spec.items():
        if (typed and required) or draw(st.booleans()):
            args[name] = draw(_control_arg(types, typed))
    if not typed and draw(st.integers(0, 3)) == 0:
        args[draw(nasty_text)] = draw(nasty)
    if op == "shutdown":
        args.pop("force", None)  # asked by hand, with jobs running: refused
    elif op == "config_set" and isinstance(args.get("name"), str):
        args["name"] = draw(st.sampled_from(SAFE_CONFIG_NAMES))
    elif op == "guard_mode" and args.get("mode") in ("off", "dry-run"):
        args["mode"] = "act"
    request: Dict[str, Any] = {"id": draw(st.integers(0, 2**31) if typed else
                                          st.integers(0, 2**31) | huge), "op": op}
    if typed or draw(st.integers(0, 5)):
        request["args"] = args
    else:
        request["args"] = draw(nasty)
    return request


# -- the engine, its jobs, the hog ----------------------------------------------------------------


@pytest.fixture
def guarded(engine: EngineProcess) -> Dict[str, Any]:
    """The engine with a running job (so a plain ``shutdown`` is refused) whose channel is the
    target of the job messages."""
    with engine.client(timeout=30) as c:
        job = c.job_start({"script": TICKER, "args": ["0", "0.5"], "name": "target"})
        wait_for(lambda: c.job_get(job.id).connected, 30, "the runner's hello")
    return {"engine": engine, "job": job}


def job_channel(ctx: Dict[str, Any]) -> Connection:
    paths = ctx["engine"].paths
    job_id = ctx["job"].id
    key = (paths.jobs_dir / job_id / "key").read_bytes()
    return Client(paths.job_address(job_id), family="AF_UNIX", authkey=key)


def control(ctx: Dict[str, Any]) -> Connection:
    paths = ctx["engine"].paths
    return Client(paths.control_address, family="AF_UNIX", authkey=paths.key_file.read_bytes())


def answer_to(conn: Connection, data: bytes) -> Dict[str, Any]:
    conn.send_bytes(data)
    while True:
        assert conn.poll(20), "no answer"
        msg = json.loads(conn.recv_bytes(rp.MAX_MESSAGE_BYTES))
        if "push" not in msg:
            return msg


def engine_fine(ctx: Dict[str, Any]) -> None:
    with EngineClient(ctx["engine"].paths, timeout=20) as c:
        assert c.status().engine.running
        jobs = c.jobs()
        assert any(j.id == ctx["job"].id for j in jobs)
        json.dumps(c.request("job_get", job=ctx["job"].id))  # plain JSON, whatever the job sent
        job = c.job_get(ctx["job"].id)
        for note in job.notes or []:
            assert str(note.message).isprintable()


def hog_is_paused_by_the_guard(ctx: Dict[str, Any], tmp_path: Path) -> None:
    progress = tmp_path / "hog-progress"
    with EngineClient(ctx["engine"].paths, timeout=30) as c:
        hog = c.job_start({"script": HOG, "args": ["50", "100", "600", str(progress)],
                           "ram_budget_mb": 300, "name": "hog"})
        try:
            # Held by the kernel at its limit (state D) a moment before the guard pauses it.
            wait_for(lambda: suspended(hog.pid) and c.job_get(hog.id).state == "paused",
                     40, "the guard to suspend the hog")
            job = c.job_get(hog.id)
            assert job.state == "paused" and job.paused_by == "guard", job
            lines = progress.read_text().splitlines()
            assert float(lines[-1].split()[0]) <= 400  # at its budget, not at its bound
        finally:
            with contextlib.suppress(Exception):
                c.job_action(hog.id, "kill", reason="test over")
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(hog.pid)
                p.resume()
                p.kill()


def no_tracebacks(ctx: Dict[str, Any]) -> None:
    engine = ctx["engine"]
    assert engine.proc.poll() is None, "the engine died:\n" + engine.stderr
    assert "Traceback" not in engine.stderr, engine.stderr[-5000:]


# -- the properties -------------------------------------------------------------------------------


def test_job_messages_never_blind_the_guard(guarded: Dict[str, Any], tmp_path: Path) -> None:
    @settings(EXAMPLES, max_examples=150)
    @given(msg=job_messages())
    def send(msg: Dict[str, Any]) -> None:
        data = to_text(msg).encode("utf-8", "surrogatepass")
        if len(data) > rp.MAX_MESSAGE_BYTES:
            return  # refused unread: covered by the channel's own tests
        conn = job_channel(guarded)
        try:
            conn.send_bytes(data)
        finally:
            conn.close()
        engine_fine(guarded)

    send()
    no_tracebacks(guarded)
    hog_is_paused_by_the_guard(guarded, tmp_path)
    engine_fine(guarded)
    no_tracebacks(guarded)


def test_control_requests_never_blind_the_guard(guarded: Dict[str, Any], tmp_path: Path
                                                ) -> None:
    codes: Dict[str, int] = {}

    @settings(EXAMPLES, max_examples=200)
    @given(request=control_requests())
    def ask(request: Dict[str, Any]) -> None:
        data = to_text(request).encode("utf-8", "surrogatepass")
        if len(data) > rp.MAX_MESSAGE_BYTES:
            return  # refused unread: covered by the channel's own tests
        conn = control(guarded)
        try:
            answer = answer_to(conn, data)
        finally:
            conn.close()
        assert isinstance(answer.get("ok"), bool)
        if not answer["ok"]:
            assert answer.get("code") in ("bad_request", "refused", "conflict"), answer
            codes[answer["code"]] = codes.get(answer["code"], 0) + 1

    ask()
    assert codes.get("bad_request") and codes.get("refused")  # both kinds were reached
    engine_fine(guarded)
    no_tracebacks(guarded)
    hog_is_paused_by_the_guard(guarded, tmp_path)
    no_tracebacks(guarded)


# -- the findings, as they were reported ----------------------------------------------------------


BAD_REQUESTS = {
    "history.end 2**64": '{"id": 1, "op": "history", "args": {"start": 0, "end": '
    + str(2**64) + "}}",
    "history.start -2**63-1": '{"id": 1, "op": "history", "args": {"start": '
    + str(-(2**63) - 1) + "}}",
    "events.after_id 2**64": '{"id": 1, "op": "events", "args": {"after_id": ' + str(2**64)
    + "}}",
    "job_log.offset 2**64": '{"id": 1, "op": "job_log", "args": {"job": "x", "offset": '
    + str(2**64) + "}}",
    "config_set.value 2**64": '{"id": 1, "op": "config_set", "args": {"name": '
    '"history.keep_days", "value": ' + str(2**64) + "}}",
    "an id of 2**64": '{"id": ' + str(2**64) + ', "op": "ping"}',
    "history.start 1e400": '{"id": 1, "op": "history", "args": {"start": 1e400}}',
    "ping with 100 000-deep args": '{"id": 1, "op": "ping", "args": ' + "[" * 100_000
    + "]" * 100_000 + "}",
    "a 100 000-deep array": "[" * 100_000 + "]" * 100_000,
    "a job spec 100 000 deep": '{"id": 1, "op": "job_start", "args": {"spec": '
    + '{"a":' * 100_000 + "0" + "}" * 100_000 + "}}",
}


def test_deep_json_and_huge_numbers_are_bad_requests(guarded: Dict[str, Any]) -> None:
    for what, text in BAD_REQUESTS.items():
        conn = control(guarded)
        try:
            answer = answer_to(conn, text.encode())
        finally:
            conn.close()
        assert answer["ok"] is False and answer["code"] == "bad_request", (what, answer)
        assert "\n" not in answer["error"] and len(answer["error"]) < 200, (what, answer)
    # The same requests within range are answered.
    with EngineClient(guarded["engine"].paths) as c:
        assert c.history(0, 2**52).end == 2**52
        assert isinstance(c.events(after_id=2**53, limit=1), list)
    engine_fine(guarded)
    no_tracebacks(guarded)


def test_a_job_that_asks_for_answers_and_never_reads_them_cannot_block_the_engine(
        guarded: Dict[str, Any], tmp_path: Path) -> None:
    """A --fit-batch forecast gets an answer: a job that sends them without end and never reads
    must not fill its channel until the engine's writes (made under the jobs' lock) block."""
    # The job's own runner, stopped, cannot say hello again and take its channel back.
    runner = psutil.Process(guarded["job"].pid)
    runner.suspend()
    conn = job_channel(guarded)
    hello = rp.encode(rp.make(rp.HELLO, job_id=guarded["job"].id, fit_hook="installed"))
    probe = rp.encode(rp.make(rp.FORECAST, fit=1, how="probe", batch=4096, micro_batch=4096,
                              accumulation=1, devices=[{
                                  "device": "ram", "fixed_bytes": 2**30,
                                  "per_sample_bytes": 2**20, "peak_bytes": 2**31,
                                  "measured_batch": 256}]))
    done = threading.Event()

    def flood() -> None:
        try:
            conn.send_bytes(hello)
            for _ in range(20_000):
                conn.send_bytes(probe)
        except OSError:
            pass
        finally:
            done.set()

    threading.Thread(target=flood, daemon=True).start()
    try:
        assert done.wait(60), "the engine stopped reading the job's channel"
        engine_fine(guarded)
        answers, cut = 0, False
        try:
            while conn.poll(1):
                conn.recv_bytes()
                answers += 1
        except (EOFError, OSError):  # cut off: what the engine may do to a peer that never
            cut = True  # reads (its unread answers then go with the connection)
        assert answers <= MAX_FIT_ANSWERS, answers
        assert cut or answers >= 1, answers
        hog_is_paused_by_the_guard(guarded, tmp_path)
        engine_fine(guarded)
        no_tracebacks(guarded)
    finally:
        conn.close()
        runner.resume()
