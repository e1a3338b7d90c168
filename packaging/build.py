"""Build Headroom's bundle and installer on the platform this runs on.

    python packaging/build.py [--clean] [--skip-deb] [--skip-installer] [--dist DIR]
                              [--deb-compression xz|zstd]

- everywhere: a PyInstaller one-folder bundle, ``dist/headroom/``;
- Linux: ``dist/headroom_<version>_<arch>.deb`` (dpkg-deb), installing under /opt/headroom;
- Windows: ``dist/headroom-<version>-setup.exe`` (Inno Setup's ISCC).

Exit status 0 when everything asked for was built, 1 when a step failed, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.metadata
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path
from string import Template
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"
RESOURCES = ROOT / "resources"
SPEC = PACKAGING / "headroom.spec"
WINDOWS = sys.platform == "win32"
LINUX = sys.platform.startswith("linux")

ICON_SIZES = (16, 22, 24, 32, 48, 64, 128, 256)
# Sizes Windows picks from an .ico (Explorer, taskbar, Start menu at 100-200 % scaling).
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)

# What Qt's xcb platform plugin and the rest of the bundle need from the system. Most of them are
# in the bundle too; naming them keeps the package working if a library is left to the system.
DEB_DEPENDS = (
    "libxcb-cursor0", "libxcb-icccm4", "libxcb-keysyms1", "libxcb-image0", "libxcb-randr0",
    "libxcb-render-util0", "libxcb-shape0", "libxcb-xfixes0", "libxcb-xkb1", "libx11-xcb1",
    "libxkbcommon0", "libxkbcommon-x11-0", "libegl1", "libgl1", "libfontconfig1",
    "libfreetype6", "libdbus-1-3",
)
DEB_MAINTAINER = "Headroom maintainers <maintainers@headroom.invalid>"
INSTALL_DIR = "/opt/headroom"


class BuildError(Exception):
    """A build step failed; the message says which and why, in one line."""


# -- small helpers ------------------------------------------------------------------------------


def read_version(root: Path = ROOT) -> str:
    """``__version__`` from trayapp/__init__.py. Raises BuildError when it is not there."""
    text = (root / "trayapp" / "__init__.py").read_text(encoding="utf-8")
    m = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", text, re.MULTILINE)
    if not m:
        raise BuildError("no __version__ in trayapp/__init__.py")
    return m.group(1)


def deb_version(version: str) -> str:
    """A Python version as Debian orders it: pre-releases sort before the release
    (``1.0rc1`` -> ``1.0~rc1``)."""
    return re.sub(r"(?<=\d)\.?(a|b|rc|dev)(?=\d)", r"~\1", version)


def numeric_version(version: str) -> str:
    """The leading ``a.b.c`` of a version padded to four numbers, as Windows wants them."""
    m = re.match(r"\d+(?:\.\d+)*", version)
    nums = m.group(0).split(".")[:4] if m else []
    return ".".join((nums + ["0"] * 4)[:4])


def tree_size(path: Path) -> int:
    """Bytes in the files under ``path``; symbolic links count as links, not what they name."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def human(n: float) -> str:
    """A size in decimal units (MB = 10^6 bytes), as the size goals are given."""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover


def run(cmd: Sequence[Union[str, Path]], what: str, env: Optional[Dict[str, str]] = None,
        cwd: Optional[Path] = None) -> None:
    """Run a build tool; raise BuildError naming the step when it fails or is missing."""
    print(f"build: {what}: {' '.join(str(c) for c in cmd)}", flush=True)
    try:
        subprocess.run([str(c) for c in cmd], check=True, env=env,
                       cwd=str(cwd) if cwd else None)
    except FileNotFoundError:
        raise BuildError(f"{what}: {cmd[0]} is not installed") from None
    except subprocess.CalledProcessError as e:
        raise BuildError(f"{what} failed (exit status {e.returncode})") from None


# -- icons --------------------------------------------------------------------------------------


def icon_png(size: int) -> Path:
    return RESOURCES / "icons" / f"headroom-{size}.png"


def write_ico(pngs: Iterable[Path], out: Path) -> Path:
    """An .ico holding the given square PNGs as they are (PNG entries, Windows Vista and
    later). Raises BuildError for a file that is not a PNG."""
    images = []
    for png in pngs:
        data = png.read_bytes()
        if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
            raise BuildError(f"{png} is not a PNG")
        width, height = struct.unpack(">II", data[16:24])
        images.append((width, height, data))
    header = struct.pack("<HHH", 0, 1, len(images))
    offset = len(header) + 16 * len(images)
    entries, blobs = b"", b""
    for width, height, data in images:
        # A dimension of 256 is written as 0 in the one-byte fields.
        entries += struct.pack("<BBBBHHII", width % 256, height % 256, 0, 0, 1, 32,
                               len(data), offset + len(blobs))
        blobs += data
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(header + entries + blobs)
    return out


# -- the bundle ---------------------------------------------------------------------------------


def build_bundle(dist: Path, work: Path, clean: bool) -> Path:
    """Run PyInstaller on the spec; returns ``dist/headroom``. Raises BuildError."""
    env = dict(os.environ)
    if WINDOWS:
        env["HEADROOM_ICO"] = str(write_ico([icon_png(s) for s in ICO_SIZES],
                                            work / "headroom.ico"))
    cmd = [sys.executable, "-m", "PyInstaller", "--noconfirm", "--log-level", "WARN",
           "--distpath", str(dist), "--workpath", str(work / "pyinstaller")]
    if clean:
        cmd.append("--clean")
    run(cmd + [str(SPEC)], "PyInstaller", env=env, cwd=ROOT)
    bundle = dist / "headroom"
    exe = bundle / ("headroom.exe" if WINDOWS else "headroom")
    if not exe.is_file():
        raise BuildError(f"PyInstaller finished but {exe} is missing")
    return bundle


# -- Linux: the .deb ----------------------------------------------------------------------------


def deb_arch() -> str:
    """The Debian architecture of this machine (``dpkg --print-architecture``)."""
    try:
        out = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                             check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        raise BuildError("dpkg is not installed: the .deb can only be built on Debian or "
                         "Ubuntu (or pass --skip-deb)") from None
    return out


def _version_key(v: str) -> tuple:
    return tuple(int(x) for x in v.split("."))


def glibc_requirement(bundle: Path) -> Optional[str]:
    """The newest ``GLIBC_x.y`` symbol version that any ELF file in the bundle needs, from
    ``objdump -p``; None when objdump is missing or finds none."""
    if shutil.which("objdump") is None:
        return None
    files = [p for p in bundle.rglob("*") if p.is_file() and not p.is_symlink()
             and (p.suffix == ".so" or ".so." in p.name or os.access(p, os.X_OK))]
    newest: Optional[str] = None
    for start in range(0, len(files), 200):
        chunk = [str(p) for p in files[start:start + 200]]
        out = subprocess.run(["objdump", "-p", *chunk], capture_output=True, text=True).stdout
        for m in re.finditer(r"\bGLIBC_(\d+\.\d+(?:\.\d+)?)\b", out):
            if newest is None or _version_key(m.group(1)) > _version_key(newest):
                newest = m.group(1)
    return newest


def _copy_bundle(bundle: Path, dest: Path) -> None:
    # Symbolic links stay links (PyInstaller 6 relies on them; copies would double the size).
    shutil.copytree(bundle, dest, symlinks=True)


def _normalise_modes(root: Path) -> None:
    # Folders and programs 0755, everything else (shared objects too, as Debian wants) 0644.
    for dirpath, _dirs, files in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in files:
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                continue
            shared_object = name.endswith(".so") or ".so." in name
            program = bool(os.stat(p).st_mode & 0o111) and not shared_object
            os.chmod(p, 0o755 if program else 0o644)


def _top_level_names(dist: importlib.metadata.Distribution) -> Set[str]:
    text = dist.read_text("top_level.txt")
    if text:
        return {line.strip() for line in text.splitlines() if line.strip()}
    names = set()
    for f in dist.files or ():
        first = f.parts[0] if f.parts else ""
        if first and not first.endswith((".dist-info", ".egg-info", ".pth")) and \
                first != "__pycache__" and ".." not in f.parts:
            names.add(first[:-3] if first.endswith(".py") else first)
    return names


def _license_of(meta: Any) -> str:
    expression = meta.get("License-Expression")
    if expression:
        return str(expression)
    text = (meta.get("License") or "").strip()
    if text and "\n" not in text and len(text) <= 60:
        return text
    classifiers = [c.split(" :: ")[-1] for c in meta.get_all("Classifier") or ()
                   if c.startswith("License :: ")]
    return ", ".join(classifiers) or "see the package's own notice"


def bundled_distributions(bundle: Path, pyz_toc: Path) -> List[Tuple[str, str, str]]:
    """(name, version, license) of each installed Python distribution that has a module in the
    bundle: on disk under _internal, or in the PYZ archive that PyInstaller listed in
    ``pyz_toc``. Headroom itself is left out."""
    tops = {p.name.split(".")[0] for p in (bundle / "_internal").iterdir()}
    if pyz_toc.is_file():
        _archive, modules = ast.literal_eval(pyz_toc.read_text(encoding="utf-8"))
        tops |= {name.split(".")[0] for name, _src, _kind in modules}
    found: Dict[str, Tuple[str, str, str]] = {}
    for dist in importlib.metadata.distributions():
        meta = dist.metadata
        name = meta["Name"]
        if not name or name.lower() in found or name.lower() == "headroom":
            continue
        if _top_level_names(dist) & tops:
            found[name.lower()] = (name, meta["Version"], _license_of(meta))
    return sorted(found.values(), key=lambda d: d[0].lower())


def copyright_text(version: str, bundle: Path, pyz_toc: Path) -> str:
    """The package's copyright notice: Headroom's license, then what the bundle holds."""
    lines = [
        f"Headroom {version}",
        "License: MIT",
        "",
        "Headroom bundles a Python runtime and Python packages under /opt/headroom/_internal,",
        "each under its own license (as its package metadata declares):",
        "",
        f"  Python {platform.python_version()}: PSF-2.0",
    ]
    lines += [f"  {name} {ver}: {lic}" for name, ver, lic in bundled_distributions(bundle, pyz_toc)]
    lines += [
        "",
        "Qt (in PySide6) is used under the LGPL-3.0; its libraries are the unmodified ones of",
        "the PySide6 wheels, in /opt/headroom/_internal/PySide6, and can be replaced there.",
        "The other shared libraries in /opt/headroom/_internal come from the Debian or Ubuntu",
        "system that built this package, under the licenses in their packages' copyright files.",
        "",
    ]
    return "\n".join(lines)


def stage_deb(bundle: Path, stage: Path, version: str, arch: str, pyz_toc: Path,
              maintainer: str = DEB_MAINTAINER) -> Path:
    """Lay out the package tree under ``stage`` (removed first): /opt/headroom, the
    /usr/bin/headroom link, the desktop entry, hicolor icons, the copyright notice,
    DEBIAN/control and md5sums. ``pyz_toc`` is PyInstaller's list of the archived modules."""
    if stage.exists():
        shutil.rmtree(stage)
    opt = stage / INSTALL_DIR.lstrip("/")
    opt.parent.mkdir(parents=True)
    _copy_bundle(bundle, opt)
    usr_bin = stage / "usr" / "bin"
    usr_bin.mkdir(parents=True)
    # Absolute: the link crosses top-level folders (Debian policy 10.5).
    os.symlink(f"{INSTALL_DIR}/headroom", usr_bin / "headroom")
    share = stage / "usr" / "share"
    (share / "applications").mkdir(parents=True)
    shutil.copyfile(RESOURCES / "headroom.desktop", share / "applications" / "headroom.desktop")
    for size in ICON_SIZES:
        d = share / "icons" / "hicolor" / f"{size}x{size}" / "apps"
        d.mkdir(parents=True)
        shutil.copyfile(icon_png(size), d / "headroom.png")
    scalable = share / "icons" / "hicolor" / "scalable" / "apps"
    scalable.mkdir(parents=True)
    shutil.copyfile(RESOURCES / "headroom.svg", scalable / "headroom.svg")
    doc = share / "doc" / "headroom"
    doc.mkdir(parents=True)
    (doc / "copyright").write_text(copyright_text(version, bundle, pyz_toc), encoding="utf-8")
    _normalise_modes(stage)

    debian = stage / "DEBIAN"
    debian.mkdir()
    depends = list(DEB_DEPENDS)
    glibc = glibc_requirement(bundle)
    if glibc:
        depends.insert(0, f"libc6 (>= {glibc})")
    installed_kib = (tree_size(stage) + 1023) // 1024
    control = Template((PACKAGING / "linux" / "control.in").read_text(encoding="utf-8"))
    (debian / "control").write_text(control.substitute(
        version=deb_version(version), arch=arch, maintainer=maintainer,
        installed_size=installed_kib, depends=", ".join(depends)), encoding="utf-8")
    sums = []
    for dirpath, _dirs, files in os.walk(stage):
        for name in sorted(files):
            p = Path(dirpath) / name
            if p.is_symlink() or debian in p.parents:
                continue
            sums.append(f"{hashlib.md5(p.read_bytes()).hexdigest()}  "
                        f"{p.relative_to(stage).as_posix()}\n")
    (debian / "md5sums").write_text("".join(sorted(sums, key=lambda s: s[34:])),
                                    encoding="utf-8")
    for f in debian.iterdir():
        os.chmod(f, 0o644)
    os.chmod(debian, 0o755)
    return stage


def build_deb(bundle: Path, dist: Path, work: Path, version: str,
              compression: str = "xz") -> Path:
    """Stage and pack the .deb; returns its path. Raises BuildError."""
    arch = deb_arch()
    name = f"headroom_{deb_version(version)}_{arch}"
    stage = stage_deb(bundle, work / "deb" / name, version, arch,
                      work / "pyinstaller" / "headroom" / "PYZ-00.toc",
                      os.environ.get("HEADROOM_DEB_MAINTAINER", DEB_MAINTAINER))
    out = dist / f"{name}.deb"
    # xz: the smallest, and every dpkg reads it; zstd packs in seconds instead of a minute, for
    # 20 % more bytes, and needs dpkg 1.21.18 (Debian 12) or Ubuntu's 1.21.1 (22.04).
    level = ["-z9"] if compression == "zstd" else []
    run(["dpkg-deb", "--root-owner-group", f"-Z{compression}", *level, "--build", stage, out],
        "dpkg-deb")
    return out


# -- Windows: the Inno Setup installer ----------------------------------------------------------


def find_iscc() -> Optional[Path]:
    """Inno Setup's command-line compiler: $ISCC, PATH, or the usual install folders."""
    candidates: List[Path] = []
    if os.environ.get("ISCC"):
        candidates.append(Path(os.environ["ISCC"]))
    found = shutil.which("iscc")
    if found:
        candidates.append(Path(found))
    for var in ("ProgramFiles(x86)", "ProgramFiles", "LOCALAPPDATA"):
        base = os.environ.get(var)
        if base:
            sub = Path(base) / "Programs" if var == "LOCALAPPDATA" else Path(base)
            candidates += sorted(sub.glob("Inno Setup*/ISCC.exe"), reverse=True)
    return next((c for c in candidates if c.is_file()), None)


def build_windows_installer(bundle: Path, dist: Path, work: Path, version: str) -> Path:
    """Compile packaging/windows/headroom.iss; returns the setup .exe. Raises BuildError."""
    iscc = find_iscc()
    if iscc is None:
        raise BuildError("Inno Setup 6 (ISCC.exe) is not installed: install it (e.g. "
                         "'choco install innosetup') or pass --skip-installer")
    ico = work / "headroom.ico"
    if not ico.exists():
        write_ico([icon_png(s) for s in ICO_SIZES], ico)
    base = f"headroom-{version}-setup"
    run([iscc, "/Q", f"/DAppVersion={version}", f"/DNumericVersion={numeric_version(version)}",
         f"/DSourceDir={bundle}", f"/DOutputDir={dist}", f"/DOutputBase={base}",
         f"/DIconFile={ico}", PACKAGING / "windows" / "headroom.iss"], "Inno Setup")
    out = dist / f"{base}.exe"
    if not out.is_file():
        raise BuildError(f"Inno Setup finished but {out} is missing")
    return out


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="build.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--clean", action="store_true",
                   help="remove earlier build output and PyInstaller's cache first")
    p.add_argument("--skip-deb", action="store_true", help="Linux: build the bundle only")
    p.add_argument("--deb-compression", choices=("xz", "zstd"), default="xz",
                   help="Linux: xz (smallest, default) or zstd (much faster to build)")
    p.add_argument("--skip-installer", action="store_true",
                   help="Windows: build the bundle only, no Inno Setup installer")
    p.add_argument("--dist", type=Path, default=ROOT / "dist", metavar="DIR",
                   help="where the bundle and the installers go (default: dist/)")
    p.add_argument("--work", type=Path, default=PACKAGING / "build", metavar="DIR",
                   help="scratch folder for the build (default: packaging/build/)")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    dist, work = args.dist.resolve(), args.work.resolve()
    started = time.monotonic()
    try:
        version = read_version()
        if args.clean:
            for path in (dist / "headroom", work):
                shutil.rmtree(path, ignore_errors=True)
        dist.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        print(f"build: Headroom {version} for {sys.platform}", flush=True)
        bundle = build_bundle(dist, work, args.clean)
        made = [("bundle", bundle, tree_size(bundle))]
        if LINUX and not args.skip_deb:
            deb = build_deb(bundle, dist, work, version, args.deb_compression)
            made.append(("deb", deb, deb.stat().st_size))
        if WINDOWS and not args.skip_installer:
            setup = build_windows_installer(bundle, dist, work, version)
            made.append(("installer", setup, setup.stat().st_size))
    except BuildError as e:
        print(f"build: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"build: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr)
        return 1
    print(f"build: done in {time.monotonic() - started:.0f} s")
    for what, path, size in made:
        print(f"  {what:<9} {path}  ({human(size)}{' unpacked' if what == 'bundle' else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
