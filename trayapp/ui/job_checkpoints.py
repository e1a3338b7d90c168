"""The jobs window's checkpoint manager: the selected job's checkpoints (each ``fit-<n>`` folder
of its checkpoint folder, with where it stands, its size and when it was saved), and what can
be done with one: open its folder, delete it, continue the job from it.

The pane only shows the engine's listing and says which button was pressed; the window asks
the engine (``job_checkpoints``, ``job_checkpoint_delete``) and relaunches the job.
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from trayapp import formats
from trayapp.engine.checkpoint_record import CheckpointInfo, CheckpointListing
from trayapp.engine.client import EngineClient
from trayapp.jobs.record import JobRecord
from trayapp.text import one_line
from trayapp.ui.forms import ERROR_STYLE, NOTE_STYLE, plain_label, plain_tip
from trayapp.ui.job_rows import CHECKPOINT_COLUMNS, checkpoint_row, relaunch_spec
from trayapp.vocab import LIVE
from trayapp.vocab import GuardAct as A
from trayapp.vocab import JobState as S


class CheckpointPane(QWidget):
    """``asked(action, name)``: "open", "delete" or "continue" pressed for checkpoint
    ``name`` (``fit-<n>``)."""

    asked = Signal(str, str)

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.listing = CheckpointListing()
        self.job: Optional[JobRecord] = None
        layout = QVBoxLayout(self)
        self.folder_label = plain_label()
        self.folder_label.setWordWrap(True)
        self.folder_label.setStyleSheet(NOTE_STYLE)
        self.folder_label.setAccessibleName("Checkpoint folder")
        layout.addWidget(self.folder_label)
        self.tree = QTreeWidget()
        self.tree.setAccessibleName("Checkpoints")
        self.tree.setHeaderLabels(list(CHECKPOINT_COLUMNS))
        self.tree.setRootIsDecorated(False)
        for col, width in enumerate((90, 260, 90)):
            self.tree.setColumnWidth(col, width)
        self.tree.currentItemChanged.connect(lambda _a, _b: self._update_buttons())
        layout.addWidget(self.tree, 1)
        bar = QHBoxLayout()
        self.buttons: Dict[str, QPushButton] = {}
        for action, text, tip in (
            ("open", "Open folder", "Open this checkpoint's folder in the file manager"),
            ("delete", "Delete…", "Delete this checkpoint's files (asks first)"),
            (
                "continue",
                "Continue from it…",
                "Launch the job again with --resume, continuing from this checkpoint",
            ),
        ):
            b = QPushButton(text)
            b.setToolTip(tip)
            b.setProperty("tip", tip)
            b.setAccessibleName(f"{text.rstrip('…')} the checkpoint")
            b.setEnabled(False)
            b.clicked.connect(lambda _c=False, a=action: self._ask(a))
            bar.addWidget(b)
            self.buttons[action] = b
        # Beside the buttons, in the room they leave: a problem said moves nothing.
        self.error = row_message(ERROR_STYLE, "Checkpoint problem", self.buttons["open"])
        bar.addWidget(self.error, 1)
        layout.addLayout(bar)

    def clear(self) -> None:
        self.listing, self.job = CheckpointListing(), None
        self.tree.clear()
        self.folder_label.setText("")
        say(self.error, None)
        self._update_buttons()

    def show_listing(self, job: Optional[JobRecord], listing: CheckpointListing) -> None:
        """Show the engine's listing of ``job``'s checkpoints; the selection stays on its
        checkpoint."""
        self.job, self.listing = job, listing
        current = self.selected()
        folder = self.listing.folder
        found = self.listing.checkpoints
        if not folder:
            text = "This job has no checkpoint folder: launch it with one to keep checkpoints."
        elif not self.listing.exists:
            text = f"{folder} does not exist (yet): the job saves its first checkpoint there."
        elif not found:
            text = f"No checkpoint in {folder} yet."
        else:
            text = f"{len(found)} checkpoint{'s' if len(found) != 1 else ''} in {folder}"
        self.folder_label.setText(one_line(text))
        self.tree.clear()
        now = time.time()
        for ck in found:  # a checkpoint's name is a file's, which the job wrote
            item = QTreeWidgetItem([one_line(cell) for cell in checkpoint_row(ck, now)])
            item.setToolTip(0, plain_tip(ck.path))
            self.tree.addTopLevelItem(item)
            if ck.name == current:
                self.tree.setCurrentItem(item)
        if self.tree.currentItem() is None and self.tree.topLevelItemCount():
            last = self.tree.topLevelItem(self.tree.topLevelItemCount() - 1)
            if last is not None:
                self.tree.setCurrentItem(last)
        self._update_buttons()

    def set_job(self, job: Optional[JobRecord]) -> None:
        """The job as it is now (what its buttons allow follows its state)."""
        if job is not None and self.job is not None and job.id == self.job.id:
            self.job = job
            self._update_buttons()

    def selected(self) -> Optional[str]:
        item = self.tree.currentItem()
        return item.text(0) if item is not None else None

    def names(self) -> List[str]:
        items = (self.tree.topLevelItem(i) for i in range(self.tree.topLevelItemCount()))
        return [item.text(0) for item in items if item is not None]

    def _update_buttons(self) -> None:
        chosen = self.selected() is not None
        live = self.job is not None and self.job.state in LIVE
        why = f"The job is {self.job.state}: stop or park it first." if live and self.job else None
        self.buttons["open"].setEnabled(chosen)
        for action in ("delete", "continue"):
            button = self.buttons[action]
            button.setEnabled(chosen and not live)
            button.setToolTip(why or str(button.property("tip")))
        if self.job is not None and not self.job.spec:
            self.buttons["continue"].setEnabled(False)
            self.buttons["continue"].setToolTip("This job has no saved spec to launch again.")

    def _ask(self, action: str) -> None:
        name = self.selected()
        if name is not None:
            say(self.error, None)
            self.asked.emit(action, name)

    def show_error(self, text: Optional[str]) -> None:
        say(self.error, text)


def row_message(style: str, name: str, beside: QWidget) -> QLabel:
    """A label for a problem, in a row of buttons: as tall as ``beside``, always there (empty
    when there is nothing to say), the whole text in its tooltip when it needs more than two
    lines. Saying something moves nothing."""
    label = QLabel()
    label.setWordWrap(True)
    label.setStyleSheet(style)
    label.setTextFormat(Qt.TextFormat.PlainText)
    label.setAccessibleName(name)
    label.setFixedHeight(max(beside.sizeHint().height(), 2 * label.fontMetrics().lineSpacing()))
    label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
    label.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
    return label


def say(label: QLabel, text: Optional[str]) -> None:
    """Show ``text`` in a ``row_message`` (None: empty), with the whole text as its tooltip."""
    label.setText(one_line(text or ""))
    label.setToolTip(plain_tip(text))


def _where(ck: CheckpointInfo) -> str:
    return formats.checkpoint_at(ck.epoch, ck.step) or "where not known"


def delete_question(job: JobRecord, ck: CheckpointInfo) -> str:
    """What the delete confirmation asks."""
    return (
        f"Delete checkpoint {ck.name} of {job.name} ({job.id}), saved at "
        f"{_where(ck)}? Its files in {ck.path} are deleted; that fit() of the "
        "script then starts over when the job is resumed."
    )


def continue_question(job: JobRecord, ck: CheckpointInfo, later: List[str]) -> str:
    """What the continue confirmation asks: how the job is launched, what is deleted."""
    how = (
        "It resumes under its own id"
        if job.state == S.PARKED or job.resumable
        else "A new job is launched with the same script and options and --resume"
    )
    text = f"Continue {job.name} ({job.id}) from {ck.name} ({_where(ck)})? {how}."
    if later:
        text += (
            f" The checkpoints of the later fits ({', '.join(later)}) are deleted first, "
            "so that those fits train again from their start."
        )
    if ck.finished:
        text += " That fit() had finished: it trains no more, the script goes on after it."
    return text


def continue_from(client: EngineClient, job: JobRecord, later: List[str]) -> JobRecord:
    """Continue ``job`` from its checkpoints after deleting those of the ``later`` fits: a
    parked (or resumable stopped) job resumes under its id, another is launched again with
    --resume (its environment taken from it). Returns the job's record. Runs on a worker
    thread (the requests block)."""
    for name in later:
        client.job_checkpoint_delete(job.id, name)
    if job.state == S.PARKED or job.resumable:
        return client.job_action(job.id, A.RESUME)
    spec = relaunch_spec(job.spec, 0)
    assert spec is not None  # choice 0 always gives a spec
    return client.job_start(spec, env_from=job.id)
