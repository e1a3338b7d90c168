"""The launch dialog's "Install as a Jupyter kernel": the form's options and interpreter become a
kernel spec that jupyter_client finds, with no script chosen; an interpreter without ipykernel
and a form that cannot run each say why in one line, and nothing is written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from tests.integration.test_kernel_cli import _venv
from tests.ui.test_launch_dialog import open_dialog, probe_cache  # noqa: F401
from trayapp.ui.launch import LaunchDialog

pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")


def _install(qtbot, dialog: LaunchDialog) -> str:  # type: ignore[no-untyped-def]
    dialog.kernel_label.setText("")
    qtbot.mouseClick(dialog.kernel_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not dialog.installing_kernel and bool(dialog.kernel_label.text()),
                    timeout=120000)
    assert dialog.kernel_label.isVisibleTo(dialog)
    return dialog.kernel_label.text()


def test_install_as_a_jupyter_kernel(qtbot, paths, start_engine, probe_cache,  # type: ignore # noqa: F811
                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_client.kernelspec import KernelSpecManager

    data_dir = tmp_path / "jupyter"
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(data_dir))
    monkeypatch.delenv("JUPYTER_PATH", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the line shortens paths in it
    start_engine(demo=True)
    dialog = open_dialog(qtbot, paths, probe_cache)
    assert dialog.script() == ""  # no script is needed for a kernel
    dialog.apply_preset("cpu-only")
    dialog.intra_spin.setValue(3)
    dialog.use_python(sys.executable)

    text = _install(qtbot, dialog)
    assert text.startswith("Installed the Jupyter kernel \u201cPython 3 (Headroom: custom)\u201d, "
                           "which runs "), text
    assert text.endswith(f"in {data_dir / 'kernels' / 'headroom'}") and "\n" not in text
    found = KernelSpecManager().find_kernel_specs()
    assert found["headroom"] == str(data_dir / "kernels" / "headroom")
    spec = json.loads((data_dir / "kernels" / "headroom" / "kernel.json").read_text())
    assert spec["argv"][0] == sys.executable
    assert spec["env"]["CUDA_VISIBLE_DEVICES"] == "-1"
    assert json.loads(spec["env"]["HEADROOM_JOB_OPTIONS"])["intra_threads"] == 3
    assert spec["env"]["HEADROOM_HOME"] == str(paths.home)

    dialog.apply_preset("desktop-safe")
    assert _install(qtbot, dialog).startswith(
        "Installed the Jupyter kernel \u201cPython 3 (Headroom: desktop-safe)\u201d")
    assert _install(qtbot, dialog).startswith("Replaced the Jupyter kernel")

    bare = _venv(tmp_path / "bare", with_ipykernel=False)
    dialog.use_python(str(bare))
    text = _install(qtbot, dialog)
    assert text.startswith("Not installed: ") and "pip install ipykernel" in text
    assert dialog.kernel_label.styleSheet() != ""  # said as a problem

    dialog.use_python(sys.executable)
    dialog.apply_preset(None)
    dialog.growth_combo.setCurrentIndex(dialog.growth_combo.findData(True))
    dialog.vram_mode.setCurrentIndex(dialog.vram_mode.findData("limit"))
    text = _install(qtbot, dialog)
    assert text.startswith("Not installed: ") and "cannot be combined" in text
    assert sorted(KernelSpecManager().find_kernel_specs()) >= ["headroom",
                                                                "headroom-desktop-safe"]
    assert sorted(p.name for p in (data_dir / "kernels").iterdir()) == [
        "headroom", "headroom-desktop-safe"]
