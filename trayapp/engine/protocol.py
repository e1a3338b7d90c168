"""The control channel's messages: what a client may ask and how answers look.

Request:  ``{"id": 7, "op": "status", "args": {...}}``
Answer:   ``{"id": 7, "ok": true, "result": ...}`` or ``{"id": 7, "ok": false, "error": "..."}``
Push:     ``{"push": "snapshot" | "event", "data": {...}}`` (to subscribed connections)

JSON through ``send_bytes``/``recv_bytes``; never pickle. Every request is checked against the
table below before a handler sees it.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, List, Optional, Tuple

from trayapp.channel import encode
from trayapp.jsonvalue import JSONObject
from trayapp.runner.protocol import MAX_MESSAGE_BYTES, ProtocolError
from trayapp.text import one_line

__all__ = [
    "MAX_MESSAGE_BYTES",
    "ProtocolError",
    "REQUESTS",
    "encode",
    "parse_request",
    "ok",
    "error",
    "push",
]

# A request nests at most this deep (a job spec is two levels), and every number in it is finite
# and within this magnitude (exact as a float, and within SQLite's 64-bit integers).
MAX_DEPTH = 32
MAX_NUMBER = 2**53

_NUM = (int, float)
_OPT_NUM = (int, float, type(None))
_OPT_STR = (str, type(None))

# op -> {arg: (allowed types, required)}
REQUESTS: Dict[str, Dict[str, Tuple[tuple, bool]]] = {
    "ping": {},
    "status": {},
    "history": {
        "start": (_NUM, True),
        "end": (_OPT_NUM, False),
        "series": ((list, type(None)), False),
        "prefix": ((list, type(None)), False),
    },
    "events": {
        "since": (_OPT_NUM, False),
        "after_id": ((int, type(None)), False),
        "job": (_OPT_STR, False),
        "limit": ((int, type(None)), False),
    },
    "subscribe": {
        "snapshots": ((bool,), False),
        "events": ((bool,), False),
        "logs": ((bool,), False),
    },
    "config_get": {},
    "config_set": {
        "name": ((str,), True),
        "value": ((str, int, float, bool), True),
        "version": (_OPT_STR, False),
    },
    "guard_mode": {"mode": ((str,), True)},
    "shutdown": {"force": ((bool,), False)},
    "jobs": {"all": ((bool,), False)},
    "job_get": {"job": ((str,), True), "curves": ((bool,), False)},
    "job_start": {
        "spec": ((dict,), True),
        "environ": ((dict, type(None)), False),
        "env_from": (_OPT_STR, False),
    },
    "job_action": {"job": ((str,), True), "action": ((str,), True), "reason": (_OPT_STR, False)},
    "job_log": {
        "job": ((str,), True),
        "offset": ((int, type(None)), False),
        "max_bytes": ((int, type(None)), False),
    },
    "jobs_pause_all": {},
    "job_checkpoints": {"job": ((str,), True)},
    "kernel_adopt": {
        "pid": ((int,), True),
        "name": (_OPT_STR, False),
        "kernel": ((dict, type(None)), False),
        "connection_file": (_OPT_STR, False),
    },
    "job_checkpoint_delete": {"job": ((str,), True), "checkpoint": ((str,), True)},
}


class _NumberOutOfRange(Exception):
    pass


def _parse_int(digits: str) -> int:
    try:
        return int(digits)
    except ValueError:  # more digits than Python converts (4300 by default): JSON all the same
        raise _NumberOutOfRange from None


def parse_request(data: bytes) -> Tuple[Any, str, JSONObject]:
    """Bytes -> (id, op, args); raises ProtocolError with a one-line reason."""
    try:
        msg = json.loads(data.decode("utf-8"), parse_int=_parse_int)
    except _NumberOutOfRange:
        raise ProtocolError("request holds a number out of range") from None
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError("request is not JSON") from None
    except RecursionError:
        raise ProtocolError(f"request is nested more than {MAX_DEPTH} deep") from None
    if not isinstance(msg, dict):
        raise ProtocolError("request is not a JSON object")
    _check_bounds(msg)
    req_id = msg.get("id")
    if not isinstance(req_id, (int, str, type(None))) or isinstance(req_id, bool):
        raise ProtocolError("id must be a number or a string")
    if isinstance(req_id, str) and len(req_id) > MAX_ID_CHARS:
        raise ProtocolError(f"id is longer than {MAX_ID_CHARS} characters")
    op = msg.get("op")
    if not isinstance(op, str) or op not in REQUESTS:
        raise ProtocolError(f"unknown op {op!r}" if isinstance(op, str) else "no op")
    args = msg.get("args", {})
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ProtocolError("args must be an object")
    spec = REQUESTS[op]
    for name in args:
        if name not in spec:
            raise ProtocolError(f"{op}: unknown argument {name!r}")
    for name, (types, required) in spec.items():
        if name not in args:
            if required:
                raise ProtocolError(f"{op}: missing argument {name!r}")
            continue
        value = args[name]
        if isinstance(value, bool) and bool not in types:
            raise ProtocolError(f"{op}: {name} has the wrong type")
        if not isinstance(value, types):
            raise ProtocolError(f"{op}: {name} has the wrong type")
        if isinstance(value, float) and not math.isfinite(value):
            raise ProtocolError(f"{op}: {name} is not a finite number")
    return req_id, op, args


def _check_bounds(msg: JSONObject) -> None:
    """Raise ProtocolError for a request nested deeper than MAX_DEPTH or holding a number that
    is not finite or not within MAX_NUMBER. Iterative: a deep request cannot exhaust the stack."""
    stack: List[Tuple[Any, int]] = [(msg, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise ProtocolError(f"request is nested more than {MAX_DEPTH} deep")
            items = value.values() if isinstance(value, dict) else value
            stack.extend((v, depth + 1) for v in items)
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise ProtocolError("request holds a number that is not finite")
            if abs(value) > MAX_NUMBER:
                raise ProtocolError("request holds a number out of range")
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_NUMBER:
            raise ProtocolError("request holds a number out of range")


def ok(req_id: Any, result: Any) -> JSONObject:
    return {"id": req_id, "ok": True, "result": result}


MAX_ID_CHARS = 200  # a request's id, given back in its answer
MAX_ERROR_CHARS = 500  # an error's message (it may quote the request)


def error(req_id: Any, message: str, code: str = "error") -> JSONObject:
    """A refusal; its message is one line of at most ``MAX_ERROR_CHARS`` (a request's words
    quoted in it cannot make the answer larger than a client reads)."""
    return {"id": req_id, "ok": False, "error": one_line(message, MAX_ERROR_CHARS), "code": code}


def push(kind: str, data: Any) -> JSONObject:
    return {"push": kind, "data": data}


def request(req_id: Any, op: str, args: Optional[JSONObject] = None) -> JSONObject:
    return {"id": req_id, "op": op, "args": args or {}}
