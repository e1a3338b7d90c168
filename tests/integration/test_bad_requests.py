"""Requests well formed at the top but wrong inside (a spec's values of the wrong type, an
action on a job that has ended, a kernel's fields of the wrong kind, a setting's value out of
its range) are refused, never answered "internal" (a fault, with a traceback in the log)."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from tests.conftest import EngineProcess, wait_for
from trayapp.engine.client import EngineClient, EngineError

BAD: List[Tuple[str, Dict[str, Any]]] = [
    ("history", {"start": 10.0, "end": 5.0}),
    ("history", {"start": 1.0, "series": "mem.used"}),
    ("history", {"start": 1.0, "prefix": [1, 2]}),
    ("events", {"limit": -5}),
    ("events", {"job": "no-such-job"}),
    ("config_set", {"name": "guard.mode", "value": 3}),
    ("config_set", {"name": "no.such", "value": 1}),
    ("config_set", {"name": "history.raw_hours", "value": "lots"}),
    ("config_set", {"name": "history.raw_hours", "value": -1}),
    ("config_set", {"name": "history.raw_hours", "value": True}),
    ("config_set", {"name": "guard.rules", "value": "x"}),
    ("guard_mode", {"mode": "sideways"}),
    ("job_get", {"job": "nope"}),
    ("job_action", {"job": "nope", "action": "pause"}),
    ("job_log", {"job": "nope"}),
    ("job_log", {"job": "nope", "offset": -1, "max_bytes": -1}),
    ("job_checkpoints", {"job": "nope"}),
    ("job_checkpoint_delete", {"job": "nope", "checkpoint": "../x"}),
    ("kernel_adopt", {"pid": -1}),
    ("kernel_adopt", {"pid": 0}),
    ("kernel_adopt", {"pid": 2**40}),
    ("kernel_adopt", {"pid": 1, "kernel": {"argv": 3}}),
    ("kernel_adopt", {"pid": 1, "kernel": {"display_name": ["x"]}}),
    ("kernel_adopt", {"pid": 1, "connection_file": "/nonexistent/x.json"}),
]
SPECS: List[Any] = [
    {}, {"script": 3}, {"script": ["a"]}, {"script": "/bin/true", "args": "x"},
    {"script": "/bin/true", "args": [1, {}]}, {"script": "/bin/true", "cwd": 5},
    {"script": "/bin/true", "env": ["A=1"]}, {"script": "/bin/true", "env": {"A": 1}},
    {"script": "/bin/true", "env": {"": "1"}}, {"script": "/bin/true", "env": {"A=B": "1"}},
    {"script": "/bin/true", "ram_budget_mb": "lots"}, {"script": "/bin/true", "ram_budget_mb": -5},
    {"script": "/bin/true", "ram_budget_mb": [1]}, {"script": "/bin/true", "ram_budget_mb": 1e300},
    {"script": "/bin/true", "vram_budget_mb": {"a": 1}}, {"script": "/bin/true", "name": 5},
    {"script": "/bin/true", "name": ["x"]}, {"script": "/bin/true", "gpus": "all-of-them"},
    {"script": "/bin/true", "gpus": [{"a": 1}]}, {"script": "/bin/true", "gpus": [-1]},
    {"script": "/bin/true", "priority": {}}, {"script": "/bin/true", "python": 7},
    {"script": "/bin/true", "protection": 9}, {"script": "/bin/true", "checkpoint_dir": 1},
    {"script": "/bin/true", "unknown_key": 1}, {"script": "/bin/true", "fit_batch": "yes"},
    {"script": "/bin/true", "max_relaunches": "many"},
    {"script": "/bin/true", "max_relaunches": -3},
    {"script": "/bin/true", "batch_size": 0}, {"script": "/bin/true", "batch_size": "x"},
]


def test_bad_requests_inside_well_formed_ones_are_refused_not_faults(
        engine: EngineProcess) -> None:
    requests = BAD + [("job_start", {"spec": s}) for s in SPECS] + [
        ("job_start", {"spec": {"script": "/bin/true"}, "environ": {"A": 1}}),
        ("job_start", {"spec": {"script": "/bin/true"}, "environ": {"": "x"}}),
        ("job_start", {"spec": {"script": "/bin/true"}, "env_from": "/nonexistent"}),
    ]
    faults = []
    with EngineClient(engine.paths, timeout=20) as c:
        for op, args in requests:
            try:
                c.request(op, **args)
            except EngineError as e:
                if e.code not in ("refused", "bad_request"):
                    faults.append((op, args, e.code, str(e)))
    assert not faults, "\n".join(map(repr, faults))
    assert engine.proc.poll() is None


def test_actions_on_a_job_that_has_ended_are_refused_not_faults(
        engine: EngineProcess, tmp_path: Any) -> None:
    script = tmp_path / "quick.py"
    script.write_text("print('done')\n")
    faults = []
    with EngineClient(engine.paths, timeout=20) as c:
        job = c.job_start({"script": str(script), "name": "quick"})
        wait_for(lambda: c.job_get(job.id).state in ("finished", "failed", "stopped"),
                 30, "the job to end")
        for action in ("pause", "resume", "stop", "kill", "park", "relaunch", "resume_from",
                       "frobnicate", ""):
            try:
                c.job_action(job.id, action)
            except EngineError as e:
                if e.code not in ("refused", "bad_request"):
                    faults.append((action, e.code, str(e)))
        for op, args in [("job_log", {"offset": 2**50}), ("job_log", {"max_bytes": 2**50}),
                         ("job_log", {"offset": -(2**40)}), ("job_checkpoints", {}),
                         ("job_checkpoint_delete", {"checkpoint": "../../etc"}),
                         ("job_checkpoint_delete", {"checkpoint": ""}),
                         ("job_get", {"curves": True})]:
            try:
                c.request(op, job=job.id, **args)
            except EngineError as e:
                if e.code not in ("refused", "bad_request"):
                    faults.append((op, args, e.code, str(e)))
    assert not faults, "\n".join(map(repr, faults))
