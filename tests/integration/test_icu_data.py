"""The bundle's trimmed ICU data, built from the real PySide6 wheel's library: the package format
round-trips, the rebuilt library exports the same symbol, and Qt loaded with it (preloaded in
place of the wheel's) still collates, upper-cases and draws the dashboard."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.fixtures import load_packaging, pyside_folder

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the Linux wheels ship ICU; elsewhere Qt uses the system's")


icu_data = load_packaging("icu_data")


@pytest.fixture(scope="module")
def wheel_library() -> Path:
    found = sorted((pyside_folder() / "Qt" / "lib").glob("libicudata.so.*"))
    if not found:
        pytest.skip("this PySide6 wheel ships no ICU data library")
    return found[0]


@pytest.fixture(scope="module")
def trimmed(wheel_library: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler (scripts/setup.sh test installs gcc)")
    out = tmp_path_factory.mktemp("icu") / wheel_library.name
    left_out, saved = icu_data.trim_library(wheel_library, out)
    assert left_out > 1000 and saved > 15 * 1024 * 1024
    return out


def _symbol(library: Path) -> str:
    return f"icudt{library.name.rsplit('.', 1)[-1]}_dat"


def test_the_package_round_trips_item_for_item(wheel_library: Path) -> None:
    blob = icu_data.library_symbol(wheel_library, _symbol(wheel_library))
    package = icu_data.read_package(blob)
    again = icu_data.read_package(icu_data.write_package(package))
    assert again.header == package.header
    assert [n for n, _ in again.items] == [n for n, _ in package.items]
    # Items keep their bytes; only the padding between them may differ.
    assert all(a.rstrip(b"\0\xaa") == b.rstrip(b"\0\xaa")
               for (_, a), (_, b) in zip(again.items, package.items))


def test_what_is_left_out(wheel_library: Path) -> None:
    blob = icu_data.library_symbol(wheel_library, _symbol(wheel_library))
    names = [n.split("/", 1)[1] for n, _ in icu_data.read_package(blob).items]
    kept = {n for n in names if not icu_data.dropped_item("icudt/" + n)}
    assert {"coll/root.res", "coll/ucadata.icu", "root.res", "nfkc.nrm", "uts46.nrm",
            "cnvalias.icu", "zoneinfo64.res", "likelySubtags.res"} <= kept
    assert not {"coll/de.res", "brkitr/cjdict.dict", "ibm-943_P15A-2003.cnv", "curr/en.res",
                "zone/de.res", "translit/root.res"} & kept


def test_the_rebuilt_library_holds_the_trimmed_package(wheel_library: Path,
                                                       trimmed: Path) -> None:
    symbol = _symbol(wheel_library)
    package = icu_data.read_package(icu_data.library_symbol(trimmed, symbol))
    assert package.items and not [n for n, _ in package.items if icu_data.dropped_item(n)]
    names = [n for n, _ in package.items]
    assert names == sorted(names)  # ICU finds items by binary search
    assert trimmed.stat().st_size < wheel_library.stat().st_size / 3
    soname = subprocess.run(["readelf", "-d", str(trimmed)], capture_output=True, text=True)
    assert f"[{wheel_library.name}]" in soname.stdout


QT_CHECK = r"""
import sys
from PySide6.QtCore import QCollator, QLocale
from PySide6.QtWidgets import QApplication
app = QApplication([])
maps = open("/proc/self/maps").read()
assert sys.argv[1] in maps, "the trimmed library is not the one loaded"
words = sorted(["zebra", "Äpfel", "apple", "Öl", "ösen"], key=QCollator(QLocale("de_DE")).sortKey)
print(words)
print(QLocale("tr_TR").toUpper("istanbul"), QLocale("de_DE").toString(1234.5, "f", 1))
from PySide6.QtCore import QSettings
from trayapp.ui.dashboard import Dashboard
d = Dashboard(QSettings(sys.argv[2], QSettings.Format.IniFormat), demo=True)
d.show()
app.processEvents()
print(d.grab().width() > 0)
"""


def test_qt_runs_on_the_trimmed_data(trimmed: Path, tmp_path: Path) -> None:
    env = dict(os.environ, LD_PRELOAD=str(trimmed), QT_QPA_PLATFORM="offscreen",
               PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", QT_CHECK, str(trimmed),
                           str(tmp_path / "settings.ini")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "['Äpfel', 'apple', 'Öl', 'ösen', 'zebra']"
    assert lines[1] == "İSTANBUL 1.234,5"
    assert lines[2] == "True"


def test_a_file_that_is_not_icu_data_is_refused(tmp_path: Path) -> None:
    with pytest.raises(icu_data.IcuDataError):
        icu_data.read_package(b"\x00" * 64)
    header = bytearray(32)
    struct.pack_into("<H", header, 0, 32)
    header[2:4] = b"\xda\x27"
    header[12:16] = b"ResB"
    with pytest.raises(icu_data.IcuDataError, match="not a common data package"):
        icu_data.read_package(bytes(header) + b"\0" * 16)
    fake = tmp_path / "libicudata.so.99"
    fake.write_bytes(b"not an ELF file")
    with pytest.raises(icu_data.IcuDataError, match="not a 64-bit"):
        icu_data.trim_library(fake, tmp_path / "out.so")


def test_a_library_that_cannot_be_trimmed_stays_whole(tmp_path: Path) -> None:
    fake = tmp_path / "libicudata.so.99"
    fake.write_bytes(b"not an ELF file")
    said = []
    toc = [("PySide6/Qt/lib/libicudata.so.99", str(fake), "BINARY"),
           ("PySide6/Qt/lib/libQt6Core.so.6", "/x/libQt6Core.so.6", "BINARY")]
    assert icu_data.trim_in_toc(toc, tmp_path, say=said.append) == toc
    assert said and "kept whole" in said[0]
