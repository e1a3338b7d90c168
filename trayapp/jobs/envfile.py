"""The one place a job's environment values are kept: ``jobs/<id>/environ.json``, 0600.

Environment values are secrets as often as not (``--env API_KEY=...``, a shell's tokens), so they
never reach the database, the events or a log: the job's spec as the engine keeps and shows it
has the names of its ``--env`` variables with ``null`` for each value (``hide``). The values,
and the environment of the shell that ran ``headroom run``, are kept in this one private file, so
that a relaunch (``headroom resume`` of a parked job, the jobs window's relaunch) gets them back
(``restore``).

The file: ``{"version": 2, "environ": {NAME: VALUE} | null, "env": [[NAME, VALUE], ...]}``.
An older engine wrote the shell's environment alone as ``{NAME: VALUE}``; it still reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from trayapp import config as configmod
from trayapp import private
from trayapp.errors import Refused
from trayapp.jobs.stored_spec import names_only
from trayapp.jsonvalue import JSONObject

FILE_NAME = "environ.json"
VERSION = 2
MAX_BYTES = 16 * 1024 * 1024  # a shell's environment is kilobytes; this is a sanity bound


def hide(spec_json: Mapping[str, Any]) -> JSONObject:
    """``spec_json`` (``JobSpec.to_json()``) with each ``env`` value replaced by None: the
    names stay, the values go (``StoredSpec``)."""
    out = dict(spec_json)
    env = names_only(out.get("env"))
    if env is not None:
        out["env"] = env
    return out


def hidden_names(spec_json: Mapping[str, Any]) -> List[str]:
    """The ``env`` names whose value ``hide`` took out."""
    env = spec_json.get("env")
    if not isinstance(env, list):
        return []
    return [str(p[0]) for p in env if isinstance(p, (list, tuple)) and len(p) == 2 and p[1] is None]


def save(
    folder: Path, environ: Optional[Mapping[str, str]], env: Sequence[Tuple[str, str]]
) -> None:
    """Keep the shell's ``environ`` (None: the job starts from the engine's) and the spec's
    ``--env`` pairs in ``folder``'s private file (written only when there is something)."""
    if environ is None and not env:
        return
    data = {
        "version": VERSION,
        "environ": dict(environ) if environ is not None else None,
        "env": [[k, v] for k, v in env],
    }
    configmod.atomic_write(folder / FILE_NAME, json.dumps(data), mode=0o600)


def load(folder: Path) -> Tuple[Optional[Dict[str, str]], Dict[str, str]]:
    """(the shell's environment or None, the ``--env`` values by name) from ``folder``'s file;
    (None, {}) when there is none or it cannot be used (another user's, a link, not JSON)."""
    try:
        data = json.loads(private.read_private(folder / FILE_NAME, limit=MAX_BYTES))
    except (OSError, ValueError):  # UnsafePath is a ValueError
        return None, {}
    if not isinstance(data, dict):
        return None, {}
    if data.get("version") != VERSION:  # an older engine's: the shell's environment alone
        return {str(k): str(v) for k, v in data.items()}, {}
    environ = data.get("environ")
    env = data.get("env")
    values: Dict[str, str] = {}
    if isinstance(env, list):
        for pair in env:
            if isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair):
                values[pair[0]] = pair[1]
    return (
        {str(k): str(v) for k, v in environ.items()} if isinstance(environ, dict) else None,
        values,
    )


def restore(spec_json: Mapping[str, Any], folder: Optional[Path]) -> Dict[str, Any]:
    """``spec_json`` with each hidden ``env`` value (None) put back from ``folder``'s file.

    Raises ValueError (one line, naming the variables) when a hidden value is not kept there."""
    out = dict(spec_json)
    names = hidden_names(out)
    if not names:
        return out
    _, values = load(folder) if folder is not None else (None, {})
    missing = [n for n in names if n not in values]
    if missing:
        raise Refused(
            f"the value of --env {', '.join(missing)} was not kept for this job; "
            "launch it again with --env NAME=VALUE"
        )
    env = out.get("env")
    assert isinstance(env, list)  # hidden_names found pairs in it
    out["env"] = [[p[0], values[p[0]] if p[1] is None else p[1]] for p in env]
    return out


def _visible_pairs(spec: Any) -> List[Tuple[str, str]]:
    env = spec.get("env") if isinstance(spec, dict) else None
    if isinstance(env, Mapping):
        env = [[k, v] for k, v in env.items()]
    if not isinstance(env, list):
        return []
    return [
        (str(p[0]), p[1])
        for p in env
        if isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[1], str)
    ]


def hide_stored(store: Any, jobs_dir: Path) -> int:
    """Jobs an older Headroom saved with their ``--env`` values in the database (and in
    ``spec.json``): the values move to the job's private file, where its folder is still
    there, and the saved spec keeps the names only. Returns how many jobs changed."""

    def change(job: JSONObject) -> Optional[JSONObject]:
        spec = job.get("spec")
        pairs = _visible_pairs(spec)
        if not pairs or not isinstance(spec, Mapping):
            return None
        folder = jobs_dir / str(job.get("id"))
        if folder.is_dir() and not folder.is_symlink():
            environ, values = load(folder)
            values.update(pairs)
            try:
                save(folder, environ, sorted(values.items()))
                spec_file = folder / "spec.json"
                if spec_file.is_file() and not spec_file.is_symlink():
                    configmod.atomic_write(spec_file, json.dumps(hide(spec), indent=2) + "\n")
            except OSError:
                pass  # the values are dropped then: a relaunch asks for them
        return dict(job, spec=hide(spec))

    return int(store.rewrite_jobs(change))
