"""What a request may be told: ``Refused`` (the engine will not do it; its message, one line,
goes to whoever asked as "refused") and ``Unknown`` (what it names does not exist). Any other
exception raised while a request is handled is a fault of the engine: logged with its
traceback and answered "internal", never passed off as a refusal."""

from __future__ import annotations


class Refused(ValueError):
    """A request the engine will not carry out; the message says why, in one line."""


class Unknown(Refused, LookupError):
    """What a request names (a job, a checkpoint, a process) does not exist."""
