"""The house's import rules, read from the source with ``ast`` (every import: module-level,
function-local and under ``TYPE_CHECKING``).

- No circle between modules.
- Direction (DESIGN.md): the CLI above the UI above the engine above the jobs, the probes and the
  config, all of them above the neutral modules (the vocabulary, the channel, text, private);
  a module imports its own layer or those below, never one above.
- The runner imports nothing of the rest of ``trayapp`` (the rest may import the runner).
- Nothing outside ``ui/`` imports Qt; nothing in ``ui/`` imports ``probes/``, psutil or pynvml.

An edge that still breaks a rule is listed in ``KNOWN`` with its reason, and must still exist:
the list can only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Set, Tuple

import pytest

import trayapp

ROOT = Path(trayapp.__file__).resolve().parent

# Top-level part of trayapp -> its layer (higher imports lower). A new module must be placed here.
LAYERS: Mapping[str, int] = {
    "trayapp": 0, "text": 0, "private": 0, "vocab": 0, "channel": 0, "winpipe": 0, "formats": 0,
    "series": 0, "logformat": 0, "errors": 0, "readings": 0, "channel_parts": 0, "jsonvalue": 0,
    "request_args": 0,
    "config": 1,
    "probes": 2,
    "jobs": 3,
    "engine": 4,
    "ui": 5,
    "cli": 6, "__main__": 6,
}
RUNNER = "runner"  # apart: imports nothing of trayapp, any part may import it
QT = ("PySide6", "PyQt5", "PyQt6", "shiboken6", "pyqtgraph", "qtpy")
NOT_IN_UI = ("psutil", "pynvml")  # and the probes

# (importer, imported) -> why the edge is still there. Each must still be in the graph.
KNOWN: Mapping[Tuple[str, str], str] = {}

Edge = Tuple[str, str, int]  # importer, imported, line


def modules(root: Path, package: str) -> Dict[str, Path]:
    out: Dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(root: Path, package: str) -> Tuple[Dict[str, Path], List[Edge]]:
    """Every module of the package and every import in it, resolved to a module where the
    name is one (``from trayapp import vocab`` -> ``trayapp.vocab``)."""
    mods = modules(root, package)
    edges: List[Edge] = []
    for name, path in mods.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                edges += [(name, a.name, node.lineno) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for a in node.names:
                    full = f"{base}.{a.name}"
                    edges.append((name, full if full in mods else base, node.lineno))
    return mods, sorted(set(edges))


def part(module: str, package: str) -> Optional[str]:
    """The top-level part of ``package`` that ``module`` belongs to; None outside it."""
    pieces = module.split(".")
    if pieces[0] != package:
        return None
    return pieces[1] if len(pieces) > 1 else package


def circles(mods: Iterable[str], edges: Iterable[Edge]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    names = set(mods)
    graph: Dict[str, Set[str]] = {}
    for a, b, _ in edges:
        if b in names and a != b:
            graph.setdefault(a, set()).add(b)
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(names):
        if v not in index:
            visit(v)
    return found


def broken(edges: Iterable[Edge], package: str, layers: Mapping[str, int]) -> List[str]:
    """Every import against the rules, as ``"importer -> imported (line n): why"``."""
    out: List[str] = []
    for a, b, line in edges:
        pa, pb = part(a, package), part(b, package)
        where = f"{a} -> {b} (line {line})"
        if pa == RUNNER:
            if pb is not None and pb != RUNNER:
                out.append(f"{where}: the runner imports nothing of {package}")
            continue
        if pa not in layers:
            out.append(f"{where}: {pa} has no layer")
            continue
        if b.split(".")[0] in QT and pa != "ui":
            out.append(f"{where}: Qt outside ui/")
        if pa == "ui" and (pb == "probes" or b.split(".")[0] in NOT_IN_UI):
            out.append(f"{where}: ui/ reads no hardware itself")
        if pb is None or pb == RUNNER or pb == pa:
            continue
        if pb not in layers:
            out.append(f"{where}: {pb} has no layer")
        elif layers[pb] > layers[pa]:
            out.append(f"{where}: {pa} (layer {layers[pa]}) imports {pb} (layer {layers[pb]})")
    return out


def _key(line: str) -> Tuple[str, str]:
    a, _, rest = line.partition(" -> ")
    return a, rest.partition(" (line ")[0]


def test_no_import_circle() -> None:
    mods, edges = imports(ROOT, "trayapp")
    assert circles(mods, edges) == []


def test_imports_follow_the_house_direction() -> None:
    _, edges = imports(ROOT, "trayapp")
    bad = [line for line in broken(edges, "trayapp", LAYERS) if _key(line) not in KNOWN]
    assert bad == [], "\n".join(bad)


def test_known_exceptions_are_still_there() -> None:
    """An exception that was fixed leaves the list."""
    _, edges = imports(ROOT, "trayapp")
    present = {_key(line) for line in broken(edges, "trayapp", LAYERS)}
    assert [k for k in KNOWN if k not in present] == []


def test_jobs_does_not_import_engine() -> None:
    _, edges = imports(ROOT, "trayapp")
    assert [(a, b) for a, b, _ in edges
            if a.startswith("trayapp.jobs") and b.startswith("trayapp.engine")] == []


def test_every_part_has_a_layer() -> None:
    mods, _ = imports(ROOT, "trayapp")
    parts = {part(m, "trayapp") for m in mods} - {RUNNER}
    assert parts - set(LAYERS) == set()
    assert set(LAYERS) - parts - {"trayapp"} == set(), "a layer for a part that is gone"


# -- the checks find what they look for --------------------------------------------------------


def _tree(tmp: Path, files: Mapping[str, str]) -> Path:
    root = tmp / "pkg"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


@pytest.fixture
def bad_tree(tmp_path: Path) -> Path:
    return _tree(tmp_path, {
        "__init__.py": "",
        "config.py": "def f():\n    from pkg.engine import service\n",  # function-local, up
        "engine/__init__.py": "",
        "engine/service.py": "from pkg import config\nfrom . import guard\n",
        "engine/guard.py": "import PySide6.QtCore\nfrom .service import x\n",  # circle, Qt
        "runner/__init__.py": "",
        "runner/job.py": "from pkg.config import y\n",
        "ui/__init__.py": "",
        "ui/app.py": "from pkg.probes import memory\nfrom PySide6 import QtCore\nimport psutil\n",
        "probes/__init__.py": "",
        "probes/memory.py": "",
        "extra.py": "",
    })


def test_the_checks_find_circles_and_wrong_directions(bad_tree: Path) -> None:
    mods, edges = imports(bad_tree, "pkg")
    # config -> service (in a function) -> config, and service -> guard -> service: one knot.
    assert circles(mods, edges) == [["pkg.config", "pkg.engine.guard", "pkg.engine.service"]]
    layers = {"pkg": 0, "config": 1, "probes": 2, "engine": 4, "ui": 5}
    found = broken(edges, "pkg", layers)
    text = "\n".join(found)
    assert "pkg.config -> pkg.engine.service (line 2): config (layer 1) imports engine" in text
    assert "pkg.engine.guard -> PySide6.QtCore (line 1): Qt outside ui/" in text
    assert "pkg.runner.job -> pkg.config (line 1): the runner imports nothing of pkg" in text
    assert "pkg.ui.app -> pkg.probes.memory (line 1): ui/ reads no hardware itself" in text
    assert "pkg.ui.app -> psutil (line 3): ui/ reads no hardware itself" in text
    assert not any("pkg.ui.app -> PySide6" in line for line in found)  # Qt is ui's own
    assert not any(line.startswith("pkg.engine.service -> pkg.config") for line in found)
    assert {part(m, "pkg") for m in mods} - set(layers) - {RUNNER} == {"extra"}


def test_the_guards_decision_loads_nothing_that_does_io() -> None:
    """Importing the pure guard (a fresh interpreter) loads no module that reads the machine,
    runs a process, opens a socket or starts a thread, directly or through what it imports."""
    import json
    import subprocess
    import sys

    code = ("import sys, json; before = set(sys.modules); import trayapp.engine.guard; "
            "print(json.dumps(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(ROOT.parent), check=True)
    loaded = set(json.loads(out.stdout))
    io = {"psutil", "pynvml", "subprocess", "socket", "threading", "multiprocessing",
          "logging", "trayapp.channel", "trayapp.jobs.job", "trayapp.probes.processes"}
    assert not loaded & io, sorted(loaded & io)
    assert "trayapp.engine.guard.core" in loaded  # it did import the guard
