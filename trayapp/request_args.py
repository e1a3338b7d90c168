"""A request's arguments as a handler reads them.

The engine checks each request against its op's table (``engine/protocol.REQUESTS``: every
argument's types, and which are required) before a handler sees it, and hands the handler an
``Args``. Each read names the type the table promises; one that does not hold (a table and a
handler that disagree) is refused with the argument's name, never passed on as the wrong type."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Type, TypeVar

from trayapp.channel import Peer
from trayapp.errors import Refused
from trayapp.jsonvalue import JSONObject, JSONValue

T = TypeVar("T")

__all__ = ["Args", "Handler", "Handlers"]


class Args:
    """The arguments of one request, read by name and type; a missing optional one is None."""

    __slots__ = ("_values",)

    def __init__(self, values: Optional[Mapping[str, JSONValue]] = None) -> None:
        self._values: JSONObject = dict(values or {})

    def __repr__(self) -> str:
        return f"Args({self._values!r})"

    def __contains__(self, name: str) -> bool:
        return self._values.get(name) is not None

    def _read(self, name: str, types: Tuple[Type[Any], ...], what: str) -> Any:
        value = self._values.get(name)
        if value is None:
            return None
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            raise Refused(f"{name} must be {what}")
        return value

    def _needed(self, name: str, value: Optional[T]) -> T:
        if value is None:
            raise Refused(f"missing argument {name!r}")
        return value

    def text(self, name: str) -> str:
        """A required text."""
        return self._needed(name, self.opt_text(name))

    def opt_text(self, name: str) -> Optional[str]:
        return self._read(name, (str,), "a text")  # type: ignore[no-any-return]

    def opt_int(self, name: str) -> Optional[int]:
        return self._read(name, (int,), "a whole number")  # type: ignore[no-any-return]

    def opt_number(self, name: str) -> Optional[float]:
        value = self._read(name, (int, float), "a number")
        return None if value is None else float(value)

    def number(self, name: str) -> float:
        """A required number."""
        return self._needed(name, self.opt_number(name))

    def flag(self, name: str, default: bool = False) -> bool:
        value = self._read(name, (bool,), "true or false")
        return default if value is None else bool(value)

    def opt_texts(self, name: str) -> Optional[List[str]]:
        """A list of texts (each item checked)."""
        value = self._read(name, (list,), "a list of texts")
        if value is not None and not all(isinstance(v, str) for v in value):
            raise Refused(f"{name} must be a list of texts")
        return None if value is None else list(value)

    def opt_object(self, name: str) -> Optional[JSONObject]:
        value = self._read(name, (dict,), "an object")
        return None if value is None else dict(value)

    def object(self, name: str) -> JSONObject:
        """A required object."""
        return self._needed(name, self.opt_object(name))

    def value(self, name: str) -> JSONValue:
        """The argument as it came (a setting's value: text, number or true/false)."""
        return self._values.get(name)


Handler = Callable[[Peer, Args], Any]  # (the asking peer, its arguments) -> the answer's result
Handlers = Dict[str, Handler]
