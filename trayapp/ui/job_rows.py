"""What the jobs window shows of a job, worked out from its record: no Qt, no I/O.

The table's cells, the state with its reason, the filter, the actions a state allows, the stop
question, the relaunch spec and the rows of the details' Options tab are pure functions of a
``JobRecord``, so they are tested with records.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from trayapp import formats, vocab
from trayapp.config import format_bytes
from trayapp.engine.checkpoint_record import CheckpointInfo
from trayapp.jobs.curves import JobCurves
from trayapp.jobs.job import who
from trayapp.jobs.record import JobRecord
from trayapp.jobs.record_parts import Checkpoint, ProcessSettings
from trayapp.ui.model import (
    INTERRUPT_TEXT,
    JOB_ACTIONS,
    format_duration,
)
from trayapp.vocab import GuardAct as A
from trayapp.vocab import JobState as S

COLUMNS = ("Name", "State", "Progress", "Loss", "ETA", "RAM", "VRAM", "Elapsed")
COL_PROGRESS = COLUMNS.index("Progress")
FINISHED_STATES = vocab.ENDED
# States whose text says who paused the job and why.
PAUSE_STATES = vocab.words(S.PAUSED, S.PAUSING)
# The filter's choices: its key ("finished" shows the ended jobs) and its label.
SHOW_CHOICES = (("all", "All jobs"), ("active", "Running and parked"), ("finished", "Finished"))
ACTIONS = (A.PAUSE, A.RESUME, A.PARK, A.STOP)
STATE_COLOURS: Dict[str, str] = {
    S.RUNNING: "#2e7d32",
    S.PAUSED: "#b26a00",
    S.PAUSING: "#b26a00",
    S.PARKED: "#6a3d9a",
    S.PARKING: "#6a3d9a",
    S.FAILED: "#c0392b",
    S.LOST: "#c0392b",
    S.STOPPED: "#555555",
    S.FINISHED: "#1f5fa8",
}
LEVEL_COLOURS = {"warn": "#a15c00", "error": "#c0392b"}  # an event's level
# What the runner's hello says that the Options tab shows in sections of its own.
_HELLO_SHOWN = (
    "applied",
    "options",
    "python",
    "python_version",
    "tf_version",
    "keras_version",
    "hooked",
    "job_id",
    "pid",
)

Rows = List[Tuple[str, str]]


def progress_fraction(job: JobRecord) -> Optional[float]:
    """Training done as a share (epochs are 1-based, steps count within the epoch), or None
    when the job reports no progress."""
    epoch, epochs, step, steps = job.epoch, job.epochs, job.step, job.steps
    if job.state == S.FINISHED and epochs:
        return 1.0
    if not epochs or epoch is None:
        return None
    if steps:
        done = max(0.0, (epoch - 1) * steps + float(step or 0))
        return max(0.0, min(1.0, done / (epochs * steps)))
    return max(0.0, min(1.0, (epoch - 1) / epochs))


def progress_text(job: JobRecord) -> str:
    """``"epoch 2/5 · step 30/100"``, or "" without progress reports; a kernel between fits:
    ``"idle · last fit epoch 2/5"`` (or ``"idle"``), short enough for its bar."""
    parts = formats.progress_parts(job.epoch, job.epochs, job.step, job.steps)
    if job.kernel_idle:
        return f"idle · last fit {parts[0]}" if parts else "idle"
    shrunk = formats.batch(job.batch, job.micro_batch, job.accumulation)
    return " · ".join(parts + [shrunk] if shrunk else parts)


def loss_text(job: JobRecord) -> str:
    return formats.loss(job.metrics.get("loss"))


def elapsed_seconds(job: JobRecord, now: float) -> Optional[float]:
    if job.started is None:
        return None
    end = job.ended or now
    return max(0.0, end - job.started)


def state_text(job: JobRecord) -> str:
    """The state with why: ``"paused by the guard: RAM low"``, ``"parked by you"``,
    ``"failed (exit status 1)"``; ``", not answering"`` after a live job's whose channel was
    cut (it did not read what Headroom sent it)."""
    text = _state_why(job)
    return text + ", not answering" if job.is_live and not job.answering else text


def _state_why(job: JobRecord) -> str:
    state = job.state
    by, why = (
        (job.paused_by, job.pause_reason)
        if state in PAUSE_STATES
        else (job.parked_by, job.park_reason)
        if state in vocab.PARKED
        else (job.stopped_by, job.stop_reason)
        if state == vocab.JobState.STOPPED
        else (None, None)
    )
    if by:
        return f"{state} by {who(by)}" + (f": {why}" if why else "")
    if state in FINISHED_STATES | vocab.PARKED and job.end_reason and job.end_reason != state:
        if job.end_reason.startswith(f"{state} "):
            return job.end_reason  # "parked by user", not "parked (parked by user)"
        return f"{state} ({job.end_reason})"
    return state


def cell_text(job: JobRecord, column: int, now: float) -> str:
    name = COLUMNS[column]
    if name == "Name":
        # Its short id beside: five runs of "train" are five jobs (as the dashboard says).
        return f"{job.name} ({job.id[:4]})" if job.name else job.id
    if name == "State":
        return state_text(job)
    if name == "Progress":
        return progress_text(job)
    if name == "Loss":
        return loss_text(job)
    if name == "ETA":
        eta = job.eta_seconds
        if eta is None or job.state in FINISHED_STATES or job.kernel_idle:
            return ""
        return format_duration(eta)
    if name in ("RAM", "VRAM"):
        value = job.rss_bytes if name == "RAM" else job.vram_bytes
        if value is None:
            # An ended job has no memory; a live one whose reading is missing shows "n/a".
            return "" if job.state in FINISHED_STATES | vocab.PARKED else "n/a"
        return format_bytes(value)
    return format_duration(elapsed_seconds(job, now))


def job_matches(job: JobRecord, text: str, show: str) -> bool:
    """Whether the job passes the filter: ``show`` is "active", "finished" or "all"; ``text``
    must appear in its name, id, state or script (any case)."""
    finished = job.state in FINISHED_STATES
    if (show == "active" and finished) or (show == "finished" and not finished):
        return False
    needle = text.strip().lower()
    if not needle:
        return True
    return needle in " ".join((job.name, job.id, job.state, job.script)).lower()


def actions_for(job: Optional[JobRecord]) -> Tuple[str, ...]:
    """The actions a job's state allows (the engine has the last word)."""
    if job is None:
        return ()
    if job.state == S.STOPPED and job.resumable:
        return (A.RESUME,)  # stopped with a checkpoint folder: continues from it
    return JOB_ACTIONS.get(job.state, ())


INTERRUPT_TIP = (
    "Interrupt the kernel's fit() at the next batch end (a checkpoint first, with a "
    "checkpoint folder); the kernel and its variables stay, the cell gets "
    "KeyboardInterrupt"
)


def action_words(job: Optional[JobRecord], action: str, text: str, tip: str) -> Tuple[str, str]:
    """The button's text and tooltip for ``action`` on ``job``: a kernel's park interrupts
    its fit."""
    if action == A.PARK and job is not None and job.is_kernel:
        return INTERRUPT_TEXT, INTERRUPT_TIP
    return text, tip


def stop_question(job: JobRecord) -> str:
    """What the stop confirmation asks: what stop does to the checkpoint and to the script."""
    name = f"{job.name} ({job.id})"
    if job.is_kernel:
        return (
            f"Shut the kernel {name} down? Its variables are lost (a fit() running stops "
            "at the next batch end, after a checkpoint with a checkpoint folder). Jupyter "
            "may start the kernel again, empty."
        )
    if not job.hooked:
        return (
            f"Stop {name}? It is interrupted (as with Ctrl-C), then ended by force if it "
            "does not end; the rest of its script does not run."
        )
    if job.checkpoint_dir:
        return (
            f"Stop {name}? It saves a checkpoint and ends at the next batch; the rest of "
            "its script (after fit()) does not run. Resume continues it from the "
            "checkpoint."
        )
    return (
        f"Stop {name}? It ends at the next batch; the rest of its script (after fit()) "
        "does not run. It has no checkpoint folder, so its training progress is lost; "
        "Park needs one."
    )


RELAUNCH_CHOICES = ("Continue from the checkpoint", "Start over (the checkpoint is deleted)")


def relaunch_spec(spec: Mapping[str, Any], choice: Optional[int]) -> Optional[Dict[str, Any]]:
    """The spec to launch again after the relaunch question: ``choice`` 0 continues from the
    checkpoint (``resume``), 1 starts over (``fresh``), None asks nothing (no checkpoint
    there); None when the question was cancelled."""
    if choice is None:
        return dict(spec, resume=False, fresh=False)
    if choice not in (0, 1):
        return None
    return dict(spec, resume=choice == 0, fresh=choice == 1)


def job_folder(job: JobRecord) -> Optional[Path]:
    """The job's folder (``jobs/<id>/``), from where its log lives."""
    return Path(job.log_path).parent if job.log_path else None


def plain(value: Any) -> str:
    """A value as the Options tab shows it."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return str(value)


def process_rows(process: Optional[ProcessSettings]) -> Rows:
    """(what, value) of how the job's process runs beside the desktop: its CPU priority, its
    OOM score, its log's cap; empty for a job launched before they were recorded."""
    if process is None:
        return []
    rows = []
    nice, oom, cap = process.nice, process.oom_score_adj, process.log_max_bytes
    if nice is not None:
        rows.append(
            (
                "CPU priority",
                f"nice {nice}"
                + (" (the desktop's normal priority)" if nice == 0 else " (below the desktop)"),
            )
        )
    if oom is not None and sys.platform != "win32":
        rows.append(
            (
                "OOM score",
                f"oom_score_adj {oom:+d} (the kernel's OOM killer takes it before the desktop)"
                if oom > 0
                else f"oom_score_adj {oom}",
            )
        )
    if cap is not None:
        rows.append(("Log", f"capped at {format_bytes(cap)} (its head and its tail kept)"))
    return rows


def checkpoint_text(ck: Checkpoint) -> str:
    """The last checkpoint with where it stands, as Keras numbers the epochs:
    ``/ckpt/fit-1 (epoch 22, batch 2)`` or ``(end of epoch 26)`` (``formats.checkpoint_at``)."""
    where = formats.checkpoint_at(ck.epoch, ck.step)
    return f"{ck.path} ({where})" if where else ck.path


def applied_lines(hello: Optional[Mapping[str, Any]]) -> List[str]:
    """The runner's applied options, one line each: ``"memory_growth = True
    (tf.config.experimental.set_memory_growth)"``."""
    lines = []
    for item in (hello or {}).get("applied") or []:
        if isinstance(item, dict):
            text = f"{item.get('option', '?')} = {plain(item.get('value'))}"
            if item.get("call"):
                text += f"  ({item['call']})"
            lines.append(text)
        else:
            lines.append(plain(item))
    return lines


def _hello_sections(job: JobRecord) -> List[Tuple[str, Rows]]:
    # The runner's own report, as it sent it: every field it gave is shown.
    hello = job.hello.to_json() if job.hello is not None else {}
    if not hello:
        return [("Options applied", [("", "not reported yet (the runner has not said hello)")])]
    rows = [
        (name, value) for name, _, value in (line.partition(" = ") for line in applied_lines(hello))
    ]
    sections = [("Options applied", rows or [("", "none (TensorFlow's defaults)")])]
    sections.append(
        (
            "Interpreter",
            [
                ("Python", f"{hello.get('python_version') or '?'} ({hello.get('python') or '?'})"),
                ("TensorFlow", str(hello.get("tf_version") or "not imported")),
                ("Keras", str(hello.get("keras_version") or "n/a")),
                ("fit() progress", "hooked" if hello.get("hooked") or job.hooked else "not hooked"),
            ],
        )
    )
    asked = hello.get("options")
    if isinstance(asked, dict):
        sections.append(
            ("Options asked for", [(k, plain(v)) for k, v in asked.items() if v is not None])
        )
    rest = {k: v for k, v in hello.items() if k not in _HELLO_SHOWN}
    if rest:
        sections.append(("Reported by the runner", [(k, plain(v)) for k, v in rest.items()]))
    return sections


def option_sections(job: JobRecord) -> List[Tuple[str, Rows]]:
    """The Options tab of a job: (section title, its (what, value) rows), in order: what the
    runner applied and reported, the process, the last checkpoint, warnings and notes."""
    sections = _hello_sections(job)
    rows = process_rows(job.process) + ([("Memory", job.protection)] if job.protection else [])
    if rows:
        sections.append(("Process", rows))
    if job.checkpoint:
        sections.append(("Checkpoint", [("last", checkpoint_text(job.checkpoint))]))
    said = job.forecast.message if job.forecast is not None else ""
    if said:
        batch = (
            formats.batch(job.batch, job.micro_batch, job.accumulation) if job.accumulation else ""
        )
        rows = [("forecast", f"this job {said}")] + ([("batch", batch)] if batch else [])
        sections.append(("Memory forecast", rows))
    notes = [f"{n.level}: {n.message}" for n in job.notes]
    if job.warnings or notes:
        sections.append(("Warnings and notes", [("", w) for w in list(job.warnings) + notes]))
    return sections


def options_key(job: JobRecord) -> str:
    """What the Options tab is made of, as one string: the tab is filled again when it
    changes."""
    shown = job.to_json()
    parts = ("hello", "warnings", "notes", "checkpoint", "process", "forecast", "accumulation")
    return job.id + ":" + json.dumps([shown[k] for k in parts + ("protection",)], sort_keys=True)


def action_refusal(job: Optional[JobRecord], action: str) -> Optional[str]:
    """Why the engine would refuse ``action`` on ``job`` although its state allows it (the
    button's tooltip while it is disabled), or None."""
    if job is None or action != A.PARK or action not in actions_for(job):
        return None
    if job.is_kernel:
        if job.kernel_in_fit:
            return None
        return (
            "The kernel runs no fit() that Headroom follows: there is no fit to "
            "interrupt. Pause or stop it instead."
        )
    if not job.checkpoint_dir:
        return (
            "Park needs a checkpoint folder, and this job has none: its training progress "
            "would be lost. Pause or stop it instead; launch it with a checkpoint folder "
            "to park it."
        )
    if job.hello and not job.hooked:
        return (
            "Park needs Keras's fit() hooked, and this job does not report from it: "
            "its training progress would be lost. Pause or stop it instead."
        )
    return None


CurveData = Dict[str, Tuple[List[float], List[float]]]


def curve_data(curves: Optional[JobCurves]) -> Tuple[CurveData, CurveData]:
    """The engine's curves of a job (``jobs.curves.JobCurves``) as (per batch, per epoch
    end): ``{metric: (epoch positions, values)}``, each in the order the metrics came."""
    out: Tuple[CurveData, CurveData] = ({}, {})
    if curves is None:
        return out
    for into, points in zip(out, (curves.batches, curves.epochs)):
        for point in points:
            for name in curves.names:
                value = point.m.get(name)
                if value is not None:
                    xs, ys = into.setdefault(name, ([], []))
                    xs.append(point.x)
                    ys.append(value)
    return out


CHECKPOINT_COLUMNS = ("Checkpoint", "Where", "Size", "Saved")


def checkpoint_row(ck: CheckpointInfo, now: float) -> Tuple[str, str, str, str]:
    """A checkpoint as the manager's table shows it: ``("fit-1", "epoch 15, batch 67",
    "1.2 MiB", "14:03:27")``; "finished" is said with where it ended."""
    where = formats.checkpoint_at(ck.epoch, ck.step) or "not known"
    if ck.finished:
        where = f"finished ({where})"
    if not ck.weights:
        where += " · no weights file"
    when = formats.started(ck.time, now) if ck.time is not None else "n/a"
    size = format_bytes(ck.size_bytes) if ck.size_bytes is not None else "n/a"
    return (ck.name, where, size, when)
