"""A job record read back from the store: the fields that came from the job's messages are
checked again (an earlier engine's record, or a row written by something else, is not
trusted), then the record is read field by field. What cannot be read is left out, logged."""

from __future__ import annotations

import logging
from typing import Any, Optional

from trayapp import vocab
from trayapp.errors import Refused
from trayapp.jobs import messages
from trayapp.jobs.record import JobRecord
from trayapp.text import one_line

log = logging.getLogger("headroom.jobs")


def _one(value: Any) -> str:
    """A value of a saved record, short, for a log line (a plain id as it is)."""
    if isinstance(value, str) and len(value) <= 80 and value.isprintable():
        return value
    return repr(value)[:80]


def read(data: Any, *, adopting: bool = False) -> Optional[JobRecord]:
    """The record of a saved row (``Store.job_row``'s JSON); None for no row, or one that
    cannot be read. ``adopting``: a field reset by the checks is said (a job taken back)."""
    if not isinstance(data, dict):
        return None
    job_id = data.get("id")
    try:
        reset = messages.clean_record(data)
        if reset and adopting:
            log.warning(
                "job %s: its saved %s did not pass the checks; reset",
                _one(job_id),
                ", ".join(reset),
            )
        if data.get("state") not in vocab.ALL:
            raise Refused(f"its state {_one(data.get('state'))} is not a job state")
        return JobRecord.from_json(data)
    except Exception as e:  # any row at all: one that cannot be read must not stop the rest
        log.warning(
            "job %s: its saved record cannot be read (%s); left out",
            _one(job_id),
            one_line(e, 200),
        )
        return None
