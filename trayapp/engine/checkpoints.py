"""A job's checkpoints, for the jobs window's checkpoint manager: list the ``fit-<n>`` folders
of the job's checkpoint folder (how far each got, its size and time), and delete one.

The runner writes one ``fit-<n>`` folder per ``fit()`` call (``runner/training.py``): the
weights and ``training_metadata.json`` (``epoch``: the epoch to start from, counted from 0;
``headroom.batches_done``: the batches of it done; ``headroom.time``). Only a job's own
checkpoint folder (its spec's, never a path from the request or from the job's channel) is
read, and a delete removes only the files the runner writes, in one ``fit-<n>`` folder right
inside it, never through a symbolic link: a request cannot make the engine delete anything else.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any, Callable, Dict, Optional

from trayapp import vocab
from trayapp.channel import Peer
from trayapp.engine.checkpoint_record import CheckpointInfo, CheckpointListing
from trayapp.errors import Refused
from trayapp.jobs.record import JobRecord
from trayapp.jsonvalue import JSONObject
from trayapp.request_args import Args, Handlers
from trayapp.runner import layout

METADATA_FILE = layout.METADATA_FILE
WEIGHTS_FILE = layout.WEIGHTS_FILE
# Every file the runner writes in a fit-<n> folder.
RUNNER_FILES = layout.CHECKPOINT_FILES
MAX_METADATA_BYTES = 65536
MAX_LISTED = 1000  # fit-<n> folders a listing reads

JobLookup = Callable[[str], JobRecord]


def _count(value: Any) -> Optional[int]:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**12
    return value if ok else None


def _metadata(folder: str) -> Dict[str, Any]:
    try:
        with open(os.path.join(folder, METADATA_FILE), "rb") as f:
            data = json.loads(f.read(MAX_METADATA_BYTES))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def describe(folder: str, name: str) -> Optional[CheckpointInfo]:
    """One ``fit-<n>`` folder of ``folder`` as the listing gives it, or None when ``name`` is
    not a checkpoint folder (not ``fit-<n>``, not a real folder, no runner file in it)."""
    fit = layout.parse_fit_dir(name)
    path = os.path.join(folder, name)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if fit is None or not stat.S_ISDIR(st.st_mode):
        return None
    size, newest, files = 0, None, 0
    for file in RUNNER_FILES:
        try:
            fst = os.lstat(os.path.join(path, file))
        except OSError:
            continue
        if stat.S_ISREG(fst.st_mode):
            files += 1
            size += fst.st_size
            newest = max(newest or 0.0, fst.st_mtime)
    if not files:
        return None
    data = _metadata(path)
    found = data.get("headroom")
    extra: Dict[str, Any] = found if isinstance(found, dict) else {}
    done, accumulation = _count(extra.get("batches_done")), _count(extra.get("accumulation"))
    saved = extra.get("time")
    return CheckpointInfo(
        name=name,
        path=path,
        fit=fit,
        epoch=_count(data.get("epoch")),
        step=done // accumulation if done is not None and accumulation else done,
        finished=extra.get("finished") is True,
        time=float(saved)
        if isinstance(saved, (int, float)) and not isinstance(saved, bool) and 0 < saved < 1e11
        else newest,
        size_bytes=size,
        weights=os.path.isfile(os.path.join(path, WEIGHTS_FILE)),
    )


def list_checkpoints(folder: Optional[str], job: Optional[str] = None) -> CheckpointListing:
    """The ``fit-<n>`` folders of ``folder`` (``describe``), in fit order."""
    if not folder:
        return CheckpointListing(job)
    try:
        names = [n for n in os.listdir(folder) if layout.parse_fit_dir(n) is not None][:MAX_LISTED]
    except OSError:
        return CheckpointListing(job, folder)
    found = [d for d in (describe(folder, n) for n in names) if d is not None]
    found.sort(key=lambda d: d.fit)
    return CheckpointListing(job, folder, True, tuple(found))


def checkpoint_name(folder: str, given: str) -> str:
    """The ``fit-<n>`` name ``given`` (a name, or a path) stands for, right inside ``folder``.
    Raises ValueError for anything else (another folder, ``..``, a link, a file)."""
    name = given
    if os.sep in given or (os.altsep and os.altsep in given):
        parent, name = os.path.split(os.path.normpath(given))
        if os.path.realpath(parent) != os.path.realpath(folder):
            raise Refused(f"{given} is not in the job's checkpoint folder {folder}")
    if layout.parse_fit_dir(name) is None:
        raise Refused(f"{given} is not a checkpoint (a fit-<n> folder)")
    try:
        st = os.lstat(os.path.join(folder, name))
    except OSError:
        raise Refused(f"{name} is not in {folder} (deleted already?)") from None
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(f"{name} in {folder} is not a folder (a link is not followed)")
    return name


def delete_checkpoint(folder: str, given: str) -> JSONObject:
    """Delete the runner's files in the ``fit-<n>`` folder ``given`` names in ``folder``, and
    the folder once empty (a file of the user's there stays, and so does the folder).
    Returns ``{"deleted": name, "kept": [names left]}``; ValueError for a name it refuses."""
    name = checkpoint_name(folder, given)
    path = os.path.join(folder, name)
    # On POSIX through the folder's descriptor: a folder swapped for a link after the check
    # above is not followed.
    use_fd = (
        {os.stat, os.unlink} <= os.supports_dir_fd
        and os.listdir in os.supports_fd
        and hasattr(os, "O_NOFOLLOW")
        and hasattr(os, "O_DIRECTORY")
    )
    fd = None
    if use_fd:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as e:
            raise Refused(f"cannot open {path}: {e.strerror}") from None
    try:
        for file in RUNNER_FILES:
            try:
                st = (
                    os.lstat(file, dir_fd=fd)
                    if fd is not None
                    else os.lstat(os.path.join(path, file))
                )
                if not stat.S_ISREG(st.st_mode):
                    continue
                if fd is not None:
                    os.unlink(file, dir_fd=fd)
                else:
                    os.unlink(os.path.join(path, file))
            except FileNotFoundError:
                continue
            except OSError as e:
                raise Refused(f"cannot delete {os.path.join(path, file)}: {e.strerror}") from None
        kept = sorted(os.listdir(fd if fd is not None else path))
    finally:
        if fd is not None:
            os.close(fd)
    if not kept:
        try:
            os.rmdir(path)
        except OSError:
            pass
    return {"deleted": name, "kept": kept}


def _job_folder(job: JobRecord) -> str:
    if not job.checkpoint_dir:
        raise Refused(f"job {job.id} has no checkpoint folder")
    return job.checkpoint_dir


def handlers(find_job: JobLookup) -> Handlers:
    """The control-channel ops of checkpoints; ``find_job(ref)`` is the job manager's ``get``
    (a job's record, LookupError when there is none)."""

    def op_list(peer: Peer, args: Args) -> JSONObject:
        job = find_job(args.text("job"))
        return list_checkpoints(job.checkpoint_dir, job.id).to_json()

    def op_delete(peer: Peer, args: Args) -> JSONObject:
        job = find_job(args.text("job"))
        folder = _job_folder(job)
        if job.state in vocab.LIVE:
            raise Refused(
                f"job {job.id} is {job.state}: its checkpoints can "
                "be deleted once it is parked or has ended"
            )
        return delete_checkpoint(folder, args.text("checkpoint"))

    return {"job_checkpoints": op_list, "job_checkpoint_delete": op_delete}
