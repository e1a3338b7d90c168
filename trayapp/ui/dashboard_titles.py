"""A dashboard plot's title line: its title, the legend of its curves and layers (each name cut
to ``LABEL_CHARS``, a job's label keeping its id) and a note, fitted to the plot's width.
"""

from __future__ import annotations

import html
from typing import Sequence, Tuple

TITLE_SIZE = "9pt"
LABEL_CHARS = 36  # a legend's name is cut to this (its tooltip has it whole)


def _elided(text: str, chars: int = LABEL_CHARS) -> str:
    """``text`` cut to ``chars``; a job's label keeps its id ("sweep_lr_0.0… (job 5a5b)")."""
    if len(text) <= chars:
        return text
    name, sep, job = text.rpartition(" (job ")
    if sep and len(job) < chars // 2:
        keep = chars - len(sep + job) - 1
        return name[:keep] + "\u2026" + sep + job
    return text[: chars - 1] + "\u2026"


def fitted_title(title: str, keys: Sequence[Tuple[str, str]], note: str, width: float) -> str:
    """A plot's title line: its title, the legend (names cut to ``LABEL_CHARS``) and its note,
    within ``width`` pixels: legend entries that do not fit are left out from the end and
    counted ("+3 more")."""
    from PySide6.QtGui import QFont, QTextDocument

    def line(shown: int) -> str:
        parts = [f"<b>{html.escape(title)}</b>"] + [
            f"<span style='color:{colour}'>&#9632;</span>&nbsp;{html.escape(_elided(label))}"
            for label, colour in keys[:shown]
        ]
        if shown < len(keys):
            parts.append(f"+{len(keys) - shown} more")
        if note:
            parts.append(f"<i style='color:#8a4b00'>{html.escape(note)}</i>")
        return "&nbsp;&nbsp;&nbsp;".join(parts)

    doc = QTextDocument()
    font = QFont()
    font.setPointSizeF(float(TITLE_SIZE.removesuffix("pt")))
    doc.setDefaultFont(font)
    shown = len(keys)
    while True:
        text = line(shown)
        doc.setHtml(text)
        if shown == 0 or width <= 0 or doc.idealWidth() <= width - 24:
            return text
        shown -= 1
