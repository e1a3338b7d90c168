"""A fit's checkpoint on disk: written (weights, then metadata, each moved into place once
whole), read back, and dropped (only the files the runner writes: ``layout.CHECKPOINT_FILES``).

The metadata is Keras's ``BackupAndRestore``'s (``epoch``: the epoch to start from, ``batch``)
with Headroom's own beside it (``headroom``: batches done, accumulation, finished, fit, time,
``history``: every whole epoch's number and logs, and the training metrics' state inside an
epoch). The folders are ``layout``'s.
"""

import json
import os

from . import layout
from .layout import CHECKPOINT_FILES, METADATA_FILE, WEIGHTS_FILE


def write(model, folder, metadata):
    """Save ``model``'s weights and ``metadata`` in ``folder``; raises what saving raises."""
    os.makedirs(folder, exist_ok=True)
    saving = os.path.join(folder, layout.WEIGHTS_SAVING)
    model.save_weights(saving)
    os.replace(saving, os.path.join(folder, WEIGHTS_FILE))
    partial = os.path.join(folder, layout.METADATA_SAVING)
    with open(partial, "w") as f:
        json.dump(metadata, f)
    os.replace(partial, os.path.join(folder, METADATA_FILE))


def read_metadata(folder):
    """The metadata of the checkpoint in ``folder`` (a dict), or None."""
    try:
        with open(os.path.join(folder, METADATA_FILE)) as f:
            data = json.load(f)
    except (OSError, ValueError, TypeError):
        return None
    return data if isinstance(data, dict) else None


def drop_checkpoint(folder):
    """Delete the checkpoint files the runner wrote in ``folder``, and the folder once empty.
    A folder that merely looks like one (``fit-2023`` of the user's own) keeps what it holds."""
    if os.path.islink(folder) or not os.path.isdir(folder):
        return
    for name in CHECKPOINT_FILES:
        path = os.path.join(folder, name)
        try:
            if os.path.isfile(path) and not os.path.islink(path):
                os.remove(path)
        except OSError:
            pass
    try:
        os.rmdir(folder)  # only when nothing else is left in it
    except OSError:
        pass


def drop_checkpoints(base):
    """Delete the checkpoints of every fit in ``base`` (a folder of the runner's own), and the
    folder once empty."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        if layout.parse_fit_dir(name) is not None:
            drop_checkpoint(os.path.join(base, name))
    try:
        os.rmdir(base)
    except OSError:
        pass


def epoch_logs(logs):
    """An epoch's logs as the History keeps them (numbers), for a checkpoint's JSON."""
    out = {}
    for key, value in (logs or {}).items():
        try:
            out[str(key)] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def saved_history(metadata):
    """[[epoch, logs], ...]: the whole epochs a checkpoint's metadata holds (none when it holds
    none, or something else)."""
    extra = metadata.get("headroom") if isinstance(metadata, dict) else None
    saved = extra.get("history") if isinstance(extra, dict) else None
    out = []
    for item in saved if isinstance(saved, list) else ():
        if (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[1], dict)
            and isinstance(item[0], int)
            and not isinstance(item[0], bool)
        ):
            logs = {
                str(k): float(v)
                for k, v in item[1].items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
            out.append([item[0], logs])
    return out


def prepend_history(history, epochs_done):
    """The earlier epochs (a checkpoint's, an earlier attempt's) first in a fit's History, as
    its first epoch begins: the History that fit() returns, and that callbacks read as they
    train, has every epoch."""
    if history is None or not epochs_done or not hasattr(history, "history"):
        return
    logs = {}
    for _, values in epochs_done:
        for key, value in values.items():
            logs.setdefault(key, []).append(value)
    for key, values in logs.items():
        history.history[key] = values + list(history.history.get(key, []))
    history.epoch = [e for e, _ in epochs_done] + list(getattr(history, "epoch", []) or [])
