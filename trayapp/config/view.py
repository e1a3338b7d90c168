"""The engine's settings as its clients see them: one typed record.

The engine answers ``config_get`` (and ``config_set``, ``guard_mode``) with the settings file's
path, every setting's value by section (``Config.to_json``), the problems found in the file,
and the file's version (what a save names so that an edit made meanwhile is not written over).
``EngineClient`` reads that answer into a ``ConfigView`` with ``from_json``, which takes
anything (an older engine's answer) and keeps only what has its type; the tray, the settings
dialog, the dashboard and the machines window read it with ``value``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Tuple

from trayapp.jsonvalue import JSONObject


@dataclass(frozen=True)
class ConfigView:
    path: str = ""
    values: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # section -> key
    problems: Tuple[str, ...] = ()
    version: str = ""

    def section(self, name: str) -> Mapping[str, Any]:
        """The values of one section (``guard``, ``ui``, ...); empty when it has none."""
        got = self.values.get(name)
        return got if isinstance(got, Mapping) else {}

    def value(self, name: str, default: Any = None) -> Any:
        """The value of setting ``name`` ("guard.mode"); ``default`` when the engine gave
        none."""
        section, _, key = name.partition(".")
        return self.section(section).get(key, default)

    @classmethod
    def from_json(cls, data: Any) -> ConfigView:
        if not isinstance(data, Mapping):
            return cls()
        values = data.get("values")
        problems = data.get("problems")
        return cls(
            path=data["path"] if isinstance(data.get("path"), str) else "",
            values={str(k): v for k, v in values.items() if isinstance(v, Mapping)}
            if isinstance(values, Mapping)
            else {},
            problems=tuple(str(p) for p in problems if isinstance(p, str))
            if isinstance(problems, (list, tuple))
            else (),
            version=data["version"] if isinstance(data.get("version"), str) else "",
        )

    def to_json(self) -> JSONObject:
        return {
            "path": self.path,
            "values": {k: dict(v) for k, v in self.values.items()},
            "problems": list(self.problems),
            "version": self.version,
        }
