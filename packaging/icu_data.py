"""ICU's data, cut down to what Qt uses in Headroom.

PySide6's Linux wheels ship ICU (``libicudata.so.NN``: 30 MB, a fifth of the bundle) because Qt
Core links it. Qt reads little of it: normalization and property tables, the locale tree's
top-level bundles, the root collation. It never opens ICU's character-set converters (Qt
converts UTF-8/16/32 and Latin-1 itself and the app asks for nothing else), its break-iterator
dictionaries (Qt finds text boundaries with its own tables), or the display names of currencies,
languages, regions, units and time zones (QLocale carries its own CLDR data). Those are left out.

ICU's data library is a shared object that exports one symbol, ``icudtNN_dat``: the whole data
package in ICU's "common data" format (a header, a sorted table of contents, then the items,
each aligned to 16 bytes). :func:`trimmed_package` rewrites that package without the items
:func:`dropped_item` names; :func:`build_library` compiles it back into a shared object with the
same soname and symbol. Nothing else in ICU or Qt changes.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Iterable, List, NamedTuple, Optional, Tuple

# Trees (sub-folders of the package) whose items Qt never opens.
DROPPED_TREES = ("brkitr", "curr", "lang", "rbnf", "region", "translit", "unit", "zone")
# Of the collation tree only the root collation stays (with its index): QCollator falls back to
# it for every locale, which sorts the app's few lists the same.
KEPT_COLLATION = ("coll/root.res", "coll/ucadata.icu", "coll/res_index.res")

_LIBRARY = re.compile(r"^libicudata\.so\.(\d+)$")
_ALIGN = 16


class IcuDataError(Exception):
    """The file is not an ICU data library or package this module understands."""


class Package(NamedTuple):
    header: bytes  # the data header, padded to its declared size
    items: List[Tuple[str, bytes]]  # (name, data padded to the next item), in the TOC's order


def dropped_item(name: str) -> bool:
    """True for a package item (``icudt73l/coll/de.res``) that the bundle leaves out."""
    _, _, rest = name.partition("/")
    if "/" not in rest:
        return rest.endswith(".cnv")
    tree = rest.split("/", 1)[0]
    if tree == "coll":
        return rest not in KEPT_COLLATION
    return tree in DROPPED_TREES


def read_package(blob: bytes) -> Package:
    """Split an ICU common data package into its header and items. Raises IcuDataError."""
    if len(blob) < 32 or blob[2:4] != b"\xda\x27":
        raise IcuDataError("not ICU data (no 0xda27 magic)")
    header_size, = struct.unpack_from("<H", blob, 0)
    if blob[8] != 0:  # UDataInfo.isBigEndian
        raise IcuDataError("big-endian ICU data is not supported")
    if blob[12:16] != b"CmnD" or blob[16] != 1:
        raise IcuDataError(f"not a common data package (format {blob[12:16]!r})")
    if header_size % _ALIGN or header_size + 4 > len(blob):
        raise IcuDataError(f"unexpected header size {header_size}")
    count, = struct.unpack_from("<I", blob, header_size)
    if header_size + 4 + 8 * count > len(blob):
        raise IcuDataError(f"table of contents of {count} items does not fit")
    entries = [struct.unpack_from("<II", blob, header_size + 4 + 8 * i) for i in range(count)]
    items = []
    for i, (name_at, data_at) in enumerate(entries):
        start = header_size + name_at
        end = blob.find(b"\0", start)
        if end < 0:
            raise IcuDataError(f"item {i} has no name")
        data_end = header_size + entries[i + 1][1] if i + 1 < count else len(blob)
        if not header_size + data_at <= data_end <= len(blob):
            raise IcuDataError(f"item {i} lies outside the package")
        items.append((blob[start:end].decode("ascii"), blob[header_size + data_at:data_end]))
    return Package(blob[:header_size], items)


def write_package(package: Package) -> bytes:
    """The bytes of a common data package: the header, the table of contents (offsets from its
    start), the names, then each item aligned to 16 bytes."""
    names = [name.encode("ascii") + b"\0" for name, _ in package.items]
    toc_size = 4 + 8 * len(names)
    name_offsets, at = [], toc_size
    for raw in names:
        name_offsets.append(at)
        at += len(raw)
    data_offsets = []
    at = -(-at // _ALIGN) * _ALIGN
    for _, data in package.items:
        data_offsets.append(at)
        at += -(-len(data) // _ALIGN) * _ALIGN
    out = bytearray(package.header)
    out += struct.pack("<I", len(names))
    for n, d in zip(name_offsets, data_offsets):
        out += struct.pack("<II", n, d)
    for raw in names:
        out += raw
    for offset, (_, data) in zip(data_offsets, package.items):
        out += b"\0" * (len(package.header) + offset - len(out))
        out += data
    out += b"\0" * (-len(out) % _ALIGN)
    return bytes(out)


def trimmed_package(blob: bytes,
                    dropped: Callable[[str], bool] = dropped_item) -> Tuple[bytes, int]:
    """``blob`` without the items ``dropped`` names; returns (package, items left out)."""
    package = read_package(blob)
    kept = [(name, data) for name, data in package.items if not dropped(name)]
    return write_package(Package(package.header, kept)), len(package.items) - len(kept)


def library_symbol(path: Path, symbol: str) -> bytes:
    """The bytes of an exported data symbol of a 64-bit little-endian ELF shared object.
    Raises IcuDataError when the file is not one or does not export it."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise IcuDataError(f"{path.name} is not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]
    wanted = symbol.encode("ascii")
    for sh in sections:
        if sh[1] != 11:  # SHT_DYNSYM
            continue
        offset, size, link, entsize = sh[4], sh[5], sh[6], sh[9] or 24
        strtab = sections[link][4]
        for pos in range(offset, offset + size, entsize):
            name_at, _info, _other, shndx, value, sym_size = struct.unpack_from(
                "<IBBHQQ", data, pos)
            end = data.index(b"\0", strtab + name_at)
            if data[strtab + name_at:end] != wanted or shndx == 0:
                continue
            home = sections[shndx]
            start = home[4] + value - home[3]  # file offset = section offset + (vaddr - addr)
            if not home[3] <= value <= value + sym_size <= home[3] + home[5]:
                raise IcuDataError(f"{symbol} lies outside its section in {path.name}")
            return data[start:start + sym_size]
    raise IcuDataError(f"{path.name} does not export {symbol}")


def build_library(package: bytes, soname: str, symbol: str, out: Path,
                  compiler: Optional[str] = None) -> Path:
    """Compile ``package`` into a shared object ``out`` that exports it as ``symbol`` (what
    ICU's own data library is). Raises IcuDataError when no C compiler is found or it fails."""
    cc = compiler or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise IcuDataError("no C compiler (cc or gcc) to build the data library")
    with tempfile.TemporaryDirectory(prefix="headroom-icu-") as tmp:
        dat = Path(tmp) / "package.dat"
        dat.write_bytes(package)
        asm = Path(tmp) / "data.S"
        asm.write_text(
            "\t.section .rodata\n"
            f"\t.globl {symbol}\n"
            f"\t.type {symbol}, @object\n"
            f"\t.balign {_ALIGN}\n"
            f"{symbol}:\n"
            f'\t.incbin "{dat}"\n'
            f"\t.size {symbol}, . - {symbol}\n"
            '\t.section .note.GNU-stack,"",@progbits\n',
            encoding="ascii")
        out.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [cc, "-shared", "-nostdlib", f"-Wl,-soname,{soname}", "-Wl,-z,noexecstack",
             "-o", str(out), str(asm)], capture_output=True, text=True)
        if done.returncode != 0:
            raise IcuDataError(f"{cc} failed: {done.stderr.strip()[:300]}")
    return out


def trim_library(src: Path, out: Path, compiler: Optional[str] = None) -> Tuple[int, int]:
    """Write to ``out`` ICU's data library ``src`` without the items Qt does not use; returns
    (items left out, bytes saved). Raises IcuDataError."""
    m = _LIBRARY.match(src.name)
    if not m:
        raise IcuDataError(f"{src.name} is not named libicudata.so.NN")
    symbol = f"icudt{m.group(1)}_dat"
    package, left_out = trimmed_package(library_symbol(src, symbol))
    build_library(package, src.name, symbol, out, compiler)
    if library_symbol(out, symbol) != package:
        raise IcuDataError(f"the rebuilt {src.name} does not hold the package it was given")
    return left_out, src.stat().st_size - out.stat().st_size


def trim_in_toc(toc: Iterable[Tuple[str, str, str]], out_dir: Path,
                say: Callable[[str], None] = print) -> list:
    """A PyInstaller TOC with ICU's data library (``libicudata.so.NN``) replaced by a trimmed
    copy written under ``out_dir``. Where it cannot be trimmed (no compiler, an ICU this module
    does not read) the original stays and ``say`` tells why: the bundle is larger, not broken."""
    result = []
    for dest, src, kind in toc:
        name = Path(dest.replace("\\", "/")).name
        if kind == "BINARY" and _LIBRARY.match(name):
            out = out_dir / "icu" / name
            try:
                left_out, saved = trim_library(Path(src), out)
            except (IcuDataError, OSError) as e:
                say(f"ICU data kept whole ({name}): {e}")
            else:
                say(f"ICU data: {left_out} items Qt does not use left out of {name} "
                    f"({saved / 1048576:.1f} MiB)")
                result.append((dest, str(out), kind))
                continue
        result.append((dest, src, kind))
    return result
