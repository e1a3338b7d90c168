"""Render resources/headroom.svg to the hicolor PNG sizes in resources/icons/.

    python packaging/make_icons.py

Run it after changing the SVG and commit the PNGs; the build uses them as they are.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SVG = ROOT / "resources" / "headroom.svg"
ICON_DIR = ROOT / "resources" / "icons"
SIZES = (16, 22, 24, 32, 48, 64, 128, 256)


def png_path(size: int) -> Path:
    """Where the PNG of one size lives: resources/icons/headroom-<n>.png."""
    return ICON_DIR / f"headroom-{size}.png"


def render(svg: Path = SVG, sizes: tuple = SIZES) -> list:
    """Render ``svg`` at each size; returns the written paths. Raises RuntimeError when Qt
    cannot read the SVG."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt  # noqa: TID251 - a build tool, not the app
    from PySide6.QtGui import QGuiApplication, QImage, QPainter  # noqa: TID251
    from PySide6.QtSvg import QSvgRenderer  # noqa: TID251

    app = QGuiApplication.instance() or QGuiApplication([])
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise RuntimeError(f"Qt cannot read {svg}")
    ICON_DIR.mkdir(parents=True, exist_ok=True)
    written = []
    for size in sizes:
        image = QImage(size, size, QImage.Format.Format_ARGB32)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter)
        painter.end()
        path = png_path(size)
        if not image.save(str(path)):
            raise RuntimeError(f"cannot write {path}")
        written.append(path)
    del app
    return written


if __name__ == "__main__":
    for p in render():
        print(p.relative_to(ROOT))
    sys.exit(0)
