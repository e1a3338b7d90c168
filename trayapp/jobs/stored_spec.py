"""A job's spec as the engine keeps and shows it: ``JobSpec.to_json()``'s fields, with its
``--env`` as names only.

The values of ``--env`` live in the job's private file (``envfile``), never in its record: a
``StoredSpec`` drops every value it is given (``[["API_KEY", None]]``), so a record saved in the
database, sent to a client or written to ``spec.json`` cannot carry one. It reads as the JSON
object it stands for (a read-only mapping), and ``env_names`` are the names a relaunch asks
the private file for.
"""

from __future__ import annotations

from typing import Any, Iterator, List, Mapping, Optional, Tuple

from trayapp.jsonvalue import JSONObject

__all__ = ["StoredSpec", "names_only"]


def names_only(env: Any) -> Optional[List[List[Any]]]:
    """``env`` (pairs, or a mapping of names) as ``[[name, None], ...]``; None when it is
    neither (left out)."""
    if isinstance(env, (list, tuple)):
        return [
            [pair[0], None] for pair in env if isinstance(pair, (list, tuple)) and len(pair) == 2
        ]
    if isinstance(env, Mapping):
        return [[name, None] for name in env]
    return None


class StoredSpec(Mapping[str, Any]):
    """The spec's JSON with ``env`` reduced to names; what is not an object reads as empty."""

    __slots__ = ("_data",)

    def __init__(self, data: Optional[Mapping[str, Any]] = None) -> None:
        values = {str(k): v for k, v in data.items()} if isinstance(data, Mapping) else {}
        if "env" in values:
            values["env"] = names_only(values["env"])  # not pairs nor names: nothing kept
        self._data = values

    @classmethod
    def from_json(cls, data: Any) -> StoredSpec:
        """A stored spec from JSON; TypeError for what is not an object."""
        if not isinstance(data, Mapping):
            raise TypeError("a spec is an object")
        return cls(data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"StoredSpec({self._data!r})"

    __hash__ = None  # type: ignore[assignment]  # a mapping: compared by its items

    @property
    def env_names(self) -> Tuple[str, ...]:
        """The ``--env`` names whose values are kept in the job's private file."""
        return tuple(str(pair[0]) for pair in self._data.get("env") or ())

    def to_json(self) -> JSONObject:
        return dict(self._data)
