"""What a checkpoint folder holds: whether a job wrote a checkpoint there, and how far it got.

The runner writes one ``fit-<n>`` folder per ``fit()`` call, with ``training_metadata.json``
and the weights beside it; these read it without importing TensorFlow.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Tuple

from trayapp import formats
from trayapp.runner import layout


def _metadata(fit_folder: str) -> Optional[Dict[str, Any]]:
    try:
        with open(os.path.join(fit_folder, layout.METADATA_FILE), "rb") as f:
            data = json.loads(f.read(65536))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def checkpoint_position(folder: str) -> Tuple[str, bool]:
    """Where the last ``fit()`` of a checkpoint folder got to, as words for a message
    (" (end of epoch 26)", " (epoch 22, batch 2)", or "" when unknown: ``formats.checkpoint_at``),
    and whether that training finished."""
    try:
        names = os.listdir(folder)
    except OSError:
        return "", False
    data = None
    for _, name in reversed(layout.fit_dirs(names)):  # the last fit with readable metadata
        data = _metadata(os.path.join(folder, name))
        if data is not None:
            break
    if data is None:
        return "", False
    extra: Dict[str, Any] = data["headroom"] if isinstance(data.get("headroom"), dict) else {}
    epoch, done = data.get("epoch"), extra.get("batches_done")
    finished = extra.get("finished") is True
    if not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch < 10**9:
        return "", finished
    if not (isinstance(done, int) and not isinstance(done, bool) and 0 < done < 10**9):
        done = 0
    return (f" ({formats.checkpoint_at(epoch, done)})" if epoch or done else ""), finished


def holds_checkpoint(folder: str) -> bool:
    """Whether ``folder`` holds a checkpoint a job wrote (a ``fit-<n>`` folder with its files)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    for _, name in layout.fit_dirs(names):
        sub = os.path.join(folder, name)
        if os.path.isfile(os.path.join(sub, layout.METADATA_FILE)) or os.path.isfile(
            os.path.join(sub, layout.WEIGHTS_FILE)
        ):
            return True
    return False
