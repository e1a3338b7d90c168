"""What a checkpoint folder holds: whether a job wrote a checkpoint there, and how far it got.

The runner writes one ``fit-<n>`` folder per ``fit()`` call, with ``training_metadata.json``
and the weights beside it; these read it without importing TensorFlow.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Tuple

from trayapp import formats


def checkpoint_position(folder: str) -> Tuple[str, bool]:
    """Where the last ``fit()`` of a checkpoint folder got to, as words for a message
    (" (end of epoch 26)", " (epoch 22, batch 2)", or "" when unknown: ``formats.checkpoint_at``),
    and whether that training finished."""
    best: Optional[Tuple[int, Dict[str, Any]]] = None
    try:
        names = os.listdir(folder)
    except OSError:
        return "", False
    for name in names:
        if not (name.startswith("fit-") and name[4:].isdigit() and len(name) < 16):
            continue
        try:
            with open(os.path.join(folder, name, "training_metadata.json"), "rb") as f:
                data = json.loads(f.read(65536))
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(data, dict) and (best is None or int(name[4:]) > best[0]):
            best = (int(name[4:]), data)
    if best is None:
        return "", False
    data = best[1]
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
    for name in names:
        if name.startswith("fit-") and name[4:].isdigit():
            sub = os.path.join(folder, name)
            if os.path.isfile(os.path.join(sub, "training_metadata.json")) or os.path.isfile(
                os.path.join(sub, "latest.weights.h5")
            ):
                return True
    return False
