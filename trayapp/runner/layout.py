"""The checkpoint folder's layout, defined once: the runner writes it (``runner.training``), the
engine lists and deletes in it (``engine.checkpoints``), the job manager reads how far it got
(``jobs.checkpoint_folder``).

Stdlib only and Python >= 3.9: this module runs inside the user's own interpreter.

A job's checkpoint folder holds one ``fit-<n>`` folder per ``fit()`` call of the script,
numbered in call order from 1 (``fit_dir_name``), each with the files Keras's
``BackupAndRestore`` restores: the weights (and the optimizer's state) and the training
metadata, each written beside under a temporary name first and then moved into place. A name
is a fit folder's only as the runner writes it: ``fit-`` and the number in ASCII digits, with no
sign, no leading zero and at most ``MAX_FIT_DIGITS`` digits (``parse_fit_dir``); anything else
(``fit-01``, ``fit-x``, ``FIT-1``) is the user's, and nothing in it is read or deleted.
"""

import re

FIT_PREFIX = "fit-"
WEIGHTS_FILE = "latest.weights.h5"  # weights and optimizer state
METADATA_FILE = "training_metadata.json"  # epoch (to start from), batch, headroom {...}
WEIGHTS_SAVING = "saving.weights.h5"  # the weights while they are written
METADATA_SAVING = METADATA_FILE + ".saving"  # the metadata while it is written
# Every file a fit folder gets from the runner; nothing else in it is ever deleted.
CHECKPOINT_FILES = (WEIGHTS_FILE, METADATA_FILE, WEIGHTS_SAVING, METADATA_SAVING)

MAX_FIT_DIGITS = 9  # a billion fit() calls in one script is more than any will make
MAX_FIT = 10**MAX_FIT_DIGITS - 1
_FIT_DIR = re.compile(re.escape(FIT_PREFIX) + "([1-9][0-9]{0," + str(MAX_FIT_DIGITS - 1) + "})")


def fit_dir_name(n):
    """The folder of the script's ``n``-th ``fit()`` call (1 for the first): ``fit-<n>``."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_FIT:
        raise ValueError(f"not a fit number: {n!r}")
    return FIT_PREFIX + str(n)


def parse_fit_dir(name):
    """The fit number of a folder named as ``fit_dir_name`` names it, or None for any other
    name (``fit_dir_name(parse_fit_dir(name)) == name`` whenever it is not None)."""
    if not isinstance(name, str):
        return None
    match = _FIT_DIR.fullmatch(name)
    return int(match.group(1)) if match else None


def fit_dirs(names):
    """``[(n, name)]`` of the fit folders among ``names`` (a listing), in fit order."""
    found = []
    for name in names:
        n = parse_fit_dir(name)
        if n is not None:
            found.append((n, name))
    found.sort()
    return found
