"""What the bundle leaves out, and the imports it must not miss.

Used by the PyInstaller spec (at build time) and by the packaging tests (to check the result).
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import shutil
import struct
import subprocess
from pathlib import Path, PurePosixPath
from typing import Callable, Dict, Iterable, List, Sequence, Set, Tuple

# Never bundled: the user's jobs run in the user's own Python, which brings TensorFlow.
EXCLUDED_MODULES: List[str] = [
    "tensorflow", "tensorboard", "keras", "tf_keras", "jax", "jaxlib", "torch", "h5py",
    "ml_dtypes", "optree", "grpc", "google.protobuf", "absl", "flatbuffers", "opt_einsum",
    "scipy", "pandas", "matplotlib", "IPython", "jupyter_client", "ipykernel", "tkinter",
    "PyQt5", "PyQt6", "PySide2", "pytest", "_pytest", "pytestqt", "hypothesis", "mypy",
    "OpenGL", "cupy", "numba", "pyqtgraph.examples", "pyqtgraph.opengl", "pyqtgraph.jupyter",
    "pyqtgraph.canvas", "pyqtgraph.flowchart", "pyqtgraph.console", "numpy.f2py",
    "numpy.distutils",
    # numpy loads these on first use only, and neither the app nor the parts of pyqtgraph it
    # draws with use them (3 MB). numpy.ma stays: numpy's own functions (np.unique) use it.
    "numpy.random", "numpy.fft", "numpy.testing",
    "requests", "charset_normalizer", "urllib3", "idna", "certifi",
    # ssl stays in: the metrics exporter serves HTTPS (and prometheus_client imports it).
    "readline",
    # Qt modules the app does not use (PySide6-Essentials ships some of them).
    "PySide6.QtQml", "PySide6.QtQuick", "PySide6.QtQuickControls2", "PySide6.QtQuickWidgets",
    "PySide6.QtQuickTest", "PySide6.QtDesigner", "PySide6.QtHelp", "PySide6.QtUiTools",
    "PySide6.QtSql", "PySide6.QtXml", "PySide6.QtConcurrent", "PySide6.QtPrintSupport",
    "PySide6.QtSvgWidgets", "PySide6.QtDBus", "PySide6.Qt3DCore", "PySide6.QtMultimedia",
    "PySide6.QtWebEngineCore", "PySide6.QtWebEngineWidgets", "PySide6.QtPdf", "PySide6.QtCharts",
    "PySide6.QtDataVisualization", "PySide6.QtGraphs", "PySide6.QtTest",
]

# Files dropped from the collected binaries and data (destination paths, "/" separated; Linux
# wheels keep Qt under PySide6/Qt/, Windows wheels directly under PySide6/). Safe to drop: the
# app is in English and uses no Qt TLS (the exporter's TLS is Python's ssl), QML, SQL,
# printing, embedded-display platforms or GTK's theme (whose plugin would drag in the build
# machine's GTK stack).
DROPPED_FILES: Tuple[str, ...] = tuple(
    f"PySide6/{qt}{rest}"
    for qt in ("Qt/", "")
    for rest in (
        "translations/*",
        "qml/*",
        "plugins/tls/*",
        "plugins/networkinformation/*",
        "plugins/sqldrivers/*",
        "plugins/printsupport/*",
        "plugins/qmltooling/*",
        "plugins/qmllint/*",
        "plugins/designer/*",
        "plugins/generic/*",
        "plugins/egldeviceintegrations/*",
        "plugins/vectorimageformats/*",
        "plugins/wayland-graphics-integration-server/*",
        "plugins/platformthemes/*gtk3*",
        "plugins/platforms/*eglfs*",
        "plugins/platforms/*linuxfb*",
        "plugins/platforms/*vnc*",
        "plugins/platforms/*vkkhrdisplay*",
        "plugins/platforms/*minimalegl*",
        "plugins/imageformats/*tiff*",
        "plugins/imageformats/*webp*",
        "plugins/imageformats/*gif*",
        "plugins/imageformats/*icns*",
        "plugins/imageformats/*tga*",
        "plugins/imageformats/*wbmp*",
    )
) + (
    "*Qt6Quick*", "*Qt6Qml*", "*Qt6Pdf*", "*Qt6WebEngine*", "*Qt6Designer*", "*Qt6Sql*",
    "*Qt6Multimedia*", "*Qt6Labs*", "*Qt6Lottie*", "*Qt6WaylandCompositor*", "*Qt6EglFs*",
    "*Qt6EglFS*", "*Qt6VirtualKeyboard*",
    # Linux: D-Bus talks to the system's bus daemon; the system's own library (a dependency of
    # the .deb) matches it, and bundling ours would drag in libsystemd and libgcrypt.
    "libdbus-1.so.3",
    # Windows: the software OpenGL fallback (20 MB); widgets and pyqtgraph draw with the raster
    # engine and need no OpenGL.
    "*opengl32sw.dll",
    # pyqtgraph's own application icon, set only by pg.mkQApp(); the app makes its own
    # QApplication with Headroom's icon.
    "pyqtgraph/icons/peegee/*",
)

# Sub-packages of trayapp imported only inside functions; the runner is shipped as source.
_SKIPPED_PACKAGES = ("trayapp.runner",)


def dropped(dest: str, patterns: Sequence[str] = DROPPED_FILES) -> bool:
    """True when a bundle path (relative to the bundle's _internal folder) is left out."""
    path = PurePosixPath(dest.replace("\\", "/")).as_posix()
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


def keep(toc: Iterable[Tuple[str, str, str]]) -> list:
    """The entries of a PyInstaller TOC that are not left out (same order), with symbolic
    links whose target was left out dropped as well."""
    kept = [entry for entry in toc if not dropped(entry[0])]
    dests = {entry[0] for entry in kept}
    return [e for e in kept if e[2] != "SYMLINK" or _link_target(e) in dests]


def _link_target(entry: Tuple[str, str, str]) -> str:
    # A SYMLINK entry's second field is its target, relative to the link's folder.
    parent = PurePosixPath(entry[0].replace("\\", "/")).parent
    return posixpath.normpath((parent / entry[1].replace("\\", "/")).as_posix())


def elf_needed(path: str) -> List[str]:
    """The DT_NEEDED names of an ELF shared object or executable; [] for anything else
    (a file that is not ELF, or one that cannot be read)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    if data[:4] != b"\x7fELF":
        return []
    wide, order = data[4] == 2, "<" if data[5] == 1 else ">"
    if wide:
        shoff, = struct.unpack_from(order + "Q", data, 0x28)
        shentsize, shnum = struct.unpack_from(order + "HH", data, 0x3A)
        section, dyn = order + "IIQQQQIIQQ", order + "qQ"
    else:
        shoff, = struct.unpack_from(order + "I", data, 0x20)
        shentsize, shnum = struct.unpack_from(order + "HH", data, 0x2E)
        section, dyn = order + "IIIIIIIIII", order + "iI"
    sections = [struct.unpack_from(section, data, shoff + i * shentsize) for i in range(shnum)]
    names: List[str] = []
    for sh in sections:
        if sh[1] != 6:  # SHT_DYNAMIC
            continue
        offset, size, link = sh[4], sh[5], sh[6]
        strtab = sections[link][4]
        step = struct.calcsize(dyn)
        for pos in range(offset, offset + size, step):
            tag, value = struct.unpack_from(dyn, data, pos)
            if tag == 0:
                break
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", strtab + value)
                names.append(data[strtab + value:end].decode("utf-8", "replace"))
    return names


def prune_system_libraries(toc: Iterable[Tuple[str, str, str]],
                           needed: Callable[[str], List[str]] = elf_needed,
                           is_elf: Callable[[str], bool] = lambda path: _is_elf(path)) -> list:
    """Drop the shared libraries that PyInstaller took from the build machine's system folders
    (top-level entries whose source is outside any site-packages) when nothing left in the bundle
    links to them any more, e.g. GTK's stack once the GTK theme plugin is left out. Libraries
    loaded at run time with dlopen are never in this set: only links found at build time are."""
    entries = list(toc)
    by_dest = {e[0].replace("\\", "/"): e for e in entries}
    by_name: Dict[str, List[Tuple[str, str, str]]] = {}
    for entry in entries:
        by_name.setdefault(PurePosixPath(entry[0].replace("\\", "/")).name, []).append(entry)

    def prunable(entry: Tuple[str, str, str]) -> bool:
        dest = entry[0].replace("\\", "/")
        src = entry[1].replace("\\", "/")
        # ELF only: links in other formats (Windows DLLs) are not read, so nothing may go.
        return (entry[2] == "BINARY" and "/" not in dest and "site-packages" not in src
                and not dest.startswith("libpython") and is_elf(entry[1]))

    seen: Set[str] = set()
    todo = [e for e in entries if e[2] in ("BINARY", "EXTENSION") and not prunable(e)]
    while todo:
        entry = todo.pop()
        if entry[0] in seen:
            continue
        seen.add(entry[0])
        if entry[2] == "SYMLINK":
            target = by_dest.get(_link_target(entry))
            if target is not None:
                todo.append(target)
            continue
        for name in needed(entry[1]):
            todo.extend(by_name.get(name, ()))
    return [e for e in entries if not prunable(e) or e[0] in seen]


def hidden_imports(root: Path) -> List[str]:
    """Every module of the trayapp package except the runner's, read from the source tree
    (nothing is imported)."""
    package = root / "trayapp"
    names = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
            continue
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        name = ".".join(parts)
        if name != "trayapp.__main__" and not name.startswith(_SKIPPED_PACKAGES):
            names.append(name)
    return names


def strip_debug(toc: Iterable[Tuple[str, str, str]], out_dir: Path,
                roots: Sequence[str]) -> list:
    """The TOC with the shared objects that come from ``roots`` (the Python installation, not
    its site-packages) replaced by copies without debug sections, written under ``out_dir``.
    Some Python builds (pyenv's, for one) carry debug info that is most of libpython's size.

    Only these: a wheel's libraries were often rewritten by patchelf, and ``strip`` can break
    them ("ELF load command address/offset not page-aligned"). An entry that ``strip`` cannot
    handle, or a missing ``strip``, keeps the original file."""
    strip = shutil.which("strip")
    real_roots = [os.path.realpath(r) + os.sep for r in roots]
    result = []
    for dest, src, kind in toc:
        real = os.path.realpath(src)
        from_python = (any(real.startswith(r) for r in real_roots)
                       and "site-packages" not in real and "dist-packages" not in real)
        if strip and kind in ("BINARY", "EXTENSION") and from_python and _is_elf(real):
            target = out_dir / dest
            target.parent.mkdir(parents=True, exist_ok=True)
            done = subprocess.run([strip, "--strip-debug", "-o", str(target), real],
                                  capture_output=True)
            if done.returncode == 0:
                result.append((dest, str(target), kind))
                continue
        result.append((dest, src, kind))
    return result


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False
