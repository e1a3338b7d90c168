"""JSON as the engine sends and keeps it: what ``to_json`` gives and what goes on a channel.

A value is one of JSON's own (null, true/false, a number, a string, a list of values, an object
of values); mypy checks that what is built for the wire is JSON all through. Reading JSON back
is done by the records' ``from_json``, which check each field's type."""

from __future__ import annotations

from typing import Dict, Mapping, Sequence, Union

JSONValue = Union[None, bool, int, float, str, Sequence["JSONValue"], Mapping[str, "JSONValue"]]
JSONObject = Dict[str, JSONValue]

__all__ = ["JSONObject", "JSONValue"]
