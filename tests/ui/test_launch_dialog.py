"""The launch dialog: the summary of option sets, inline validation, presets, the remembered
settings per script, the dry-run plan, and launching through a real engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent
from PySide6.QtWidgets import QDialog

from trayapp.engine.client import EngineClient
from trayapp.jobs import spec_values as sv
from trayapp.jobs.options import JobSpec, MemoryOptions, SpecError, validate
from trayapp.readings import GpuReading, gpu_readings
from trayapp.ui.launch import LaunchDialog
from trayapp.ui.launch_form import AUTO_PYTHON, select
from trayapp.ui.launch_plan import RecentLaunches, form_row, summary_text
from trayapp.vocab import ENDED

GiB = 1024**3
pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")

GPU0 = {"index": 0, "name": "RTX 3070", "uuid": None, "memory_total_bytes": 8 * GiB,
        "memory_used_bytes": GiB, "memory_free_bytes": 7 * GiB, "display_active": True}
GPU1 = {"index": 1, "name": "RTX A4000", "uuid": None, "memory_total_bytes": 16 * GiB,
        "memory_used_bytes": 0, "memory_free_bytes": 16 * GiB, "display_active": False}


# -- the summary -----------------------------------------------------------------------------


def spec(**kw):  # type: ignore[no-untyped-def]
    options = kw.pop("options", MemoryOptions())
    return JobSpec(script="/x/train.py", options=options, **kw)


def test_summary_of_a_vram_limit_and_a_ram_budget() -> None:
    text = summary_text(spec(options=MemoryOptions(gpus=(0,), vram_limit_mb=6144),
                             ram_budget_mb=12288), gpu_readings([GPU0]), 32 * GiB)
    assert text.startswith("TensorFlow may use at most 6.0 GiB of GPU 0, leaving 2.0 GiB for "
                           "the desktop; the guard pauses the job above 12.0 GiB of RAM "
                           "(of 32.0 GiB).")
    assert text.endswith("No checkpoints: parking this job loses its training progress.")


@pytest.mark.parametrize("options, extra, expected", [
    (MemoryOptions(vram_reserve_mb=1024), {},
     "TensorFlow may use at most 7.0 GiB of GPU 0, leaving 1.0 GiB for the desktop, and may use "
     "at most 15.0 GiB of GPU 1, leaving 1.0 GiB for the desktop"),
    (MemoryOptions(gpus=(1,), memory_growth=True), {},
     "TensorFlow takes memory of GPU 1 as it needs it (up to all 16.0 GiB)"),
    (MemoryOptions(gpus=(0,)), {},
     "TensorFlow takes nearly all of GPU 0's 8.0 GiB at start, leaving little for the desktop"),
    (MemoryOptions(cpu_only=True), {"vram_budget_mb": 2048},
     "TensorFlow runs on the CPU only (it sees no GPU); the guard watches the machine's free "
     "memory (no budget for this job)."),
    (MemoryOptions(gpus=(0,), memory_growth=True, allocator="cuda_malloc_async",
                   precision="mixed_float16", xla=True), {"vram_budget_mb": 4096},
     "with CUDA's asynchronous allocator, mixed_float16 precision, XLA; the guard pauses the "
     "job above 4.0 GiB of GPU memory."),
])
def test_summary_of_option_sets(options, extra, expected) -> None:  # type: ignore[no-untyped-def]
    assert expected in summary_text(spec(options=options, **extra), gpu_readings([GPU0, GPU1]))


def test_summary_without_gpus_and_with_checkpoints() -> None:
    text = summary_text(spec(checkpoint_dir="/ck", checkpoint_every_steps=200, resume=True,
                             auto_resume=False), [])
    assert text.startswith("The engine sees no GPU, so TensorFlow runs on the CPU")
    assert "Checkpoints go to /ck every 200 steps; the job continues from the last one." in text
    assert text.endswith("After a park it waits for you to resume it.")
    every_epoch = summary_text(spec(checkpoint_dir="/ck"), [])
    assert "Checkpoints go to /ck every epoch, so a parked or stopped job continues where it " \
        "was." in every_epoch


def test_field_parsers() -> None:
    assert sv.parse_mb("--ram-budget", "") is None
    assert sv.parse_mb("--ram-budget", "4096") == 4096
    assert sv.parse_mb("--ram-budget", "12 GiB") == 12288
    with pytest.raises(SpecError, match="--ram-budget: 'lots' is not a size"):
        sv.parse_mb("--ram-budget", "lots")
    assert sv.split_args('--epochs 3 --name "my run"') == ("--epochs", "3", "--name", "my run")
    with pytest.raises(SpecError, match="arguments:"):
        sv.split_args('--name "open')
    assert sv.parse_env_lines("A=1\n\n# note\nB = x=y") == (("A", "1"), ("B", " x=y"))
    with pytest.raises(SpecError, match="--env: 'NOVALUE' is not KEY=VALUE"):
        sv.parse_env_lines("NOVALUE")


def refusal(s: JobSpec, gpus=()) -> SpecError:  # type: ignore[no-untyped-def]
    with pytest.raises(SpecError) as e:
        validate(s, gpus, check_paths=True)
    return e.value


def test_errors_land_on_their_row_by_field_not_by_words() -> None:
    gpu = GpuReading(index=0, name="GPU", uuid=None, memory_total_bytes=8 * GiB,
                     memory_used_bytes=0, memory_free_bytes=8 * GiB)
    assert form_row(refusal(spec(options=MemoryOptions(vram_limit_mb=99999)), [gpu])) == "vram"
    assert form_row(refusal(spec(options=MemoryOptions(memory_growth=True,
                                                       vram_limit_mb=10)))) == "growth"
    assert form_row(refusal(spec())) == "script"  # /x/train.py does not exist
    assert form_row(refusal(spec(resume=True))) == "resume"
    # The row comes from the field, whatever the words say.
    assert form_row(SpecError("--vram-limit: reworded", sv.RAM_BUDGET)) == "ram_budget"
    assert form_row(SpecError("--vram-limit: a message without a field")) is None
    views = gpu_readings([GPU0, {"index": "bad"}])
    assert len(views) == 1 and views[0].memory_total_bytes == 8 * GiB


def test_recent_launches_file(tmp_path: Path) -> None:
    store = RecentLaunches(tmp_path / "recent.json")
    assert store.recent() == [] and store.spec_for("/a.py") is None
    for name in ("a", "b", "a"):
        store.remember(JobSpec(script=f"/s/{name}.py", args=(name,)).to_json())
    assert store.recent() == ["/s/a.py", "/s/b.py"]
    assert store.spec_for("/s/a.py")["args"] == ["a"]
    (tmp_path / "recent.json").write_text("{not json")
    assert store.recent() == []  # a broken file is forgotten, not a crash


# -- the dialog on a real engine ------------------------------------------------------------------


@pytest.fixture(scope="session")
def probe_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Probed interpreters, shared by the tests (a probe imports TensorFlow: seconds)."""
    return tmp_path_factory.mktemp("probes")


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "work" / "train.py"
    path.parent.mkdir()
    path.write_text("import sys\nprint('hello from train', sys.argv[1:], flush=True)\n")
    return path


def open_dialog(qtbot, paths, probe_cache) -> LaunchDialog:  # type: ignore[no-untyped-def]
    dialog = LaunchDialog(lambda: EngineClient(paths, timeout=10.0), state_dir=paths.data_dir,
                          probe_cache=probe_cache)
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitUntil(lambda: dialog.status_loaded, timeout=15000)
    return dialog


def settle(dialog: LaunchDialog) -> None:
    """Validation runs a moment after a change; run it now."""
    dialog.revalidate()


def test_title_names_and_gpus(qtbot, paths, start_engine, probe_cache) -> None:  # type: ignore
    start_engine(demo=True)
    dialog = open_dialog(qtbot, paths, probe_cache)
    assert dialog.windowTitle() == "Launch training — Headroom"
    texts = [dialog.gpu_combo.itemText(i) for i in range(dialog.gpu_combo.count())]
    assert texts[0] == "All 2 GPUs"
    assert texts[1].startswith("GPU 0: Simulated RTX 4070 (demo) — ")
    assert "free of 12.0 GiB" in texts[1]
    assert texts[-1] == "CPU only"
    for key, widget in dialog.row_widgets.items():
        assert widget.accessibleName() or key in ("auto_resume", "resume"), key
    assert not dialog.launch_button.isEnabled()  # no script yet
    assert dialog.summary_label.text().startswith("Choose a training script")


def test_validation_marks_the_field(qtbot, paths, start_engine, probe_cache,  # type: ignore
                                    script) -> None:
    start_engine(demo=True)
    dialog = open_dialog(qtbot, paths, probe_cache)
    dialog.choose_script(str(script))
    settle(dialog)
    assert dialog.spec is not None and dialog.launch_button.isEnabled()

    # Growth and a limit together: the growth field says why, Launch is off.
    dialog.apply_preset(None)
    dialog.growth_combo.setCurrentIndex(dialog.growth_combo.findData(True))
    dialog.vram_mode.setCurrentIndex(dialog.vram_mode.findData("limit"))
    dialog.vram_spin.setValue(4096)
    settle(dialog)
    error = dialog.row_errors["growth"]
    assert error.isVisibleTo(dialog)
    assert "memory growth and a VRAM limit cannot be combined" in error.text()
    assert "#c0392b" in error.styleSheet()
    assert "#c0392b" in dialog.growth_combo.styleSheet()
    assert not dialog.launch_button.isEnabled()
    assert dialog.summary_label.text() == "Fix the field marked in red to launch."

    # A limit above the GPU's memory, checked against the engine's GPUs.
    dialog.growth_combo.setCurrentIndex(dialog.growth_combo.findData(None))
    dialog.gpu_combo.setCurrentIndex(dialog.gpu_combo.findData(0))
    dialog.vram_spin.setValue(50000)
    settle(dialog)
    assert not dialog.row_errors["growth"].isVisibleTo(dialog)
    assert "--vram-limit: 50000 MiB is more than GPU 0 has (12282 MiB)" in \
        dialog.row_errors["vram"].text()
    dialog.vram_spin.setValue(6144)
    settle(dialog)
    assert dialog.launch_button.isEnabled()
    assert dialog.summary_label.text().startswith(
        "TensorFlow may use at most 6.0 GiB of GPU 0, leaving 6.0 GiB for the desktop")

    # A budget that is not a size; a script that does not exist.
    dialog.ram_budget_edit.setText("lots")
    settle(dialog)
    assert "--ram-budget: 'lots' is not a size" in dialog.row_errors["ram_budget"].text()
    dialog.ram_budget_edit.setText("2 GiB")
    dialog.script_combo.setEditText(str(script.with_name("gone.py")))
    settle(dialog)
    assert dialog.row_errors["script"].text().startswith("script not found:")
    assert not dialog.launch_button.isEnabled()


def test_environment_variables_tensorflow_ignores(qtbot, paths, start_engine,  # type: ignore
                                                  probe_cache, script) -> None:
    start_engine()
    dialog = open_dialog(qtbot, paths, probe_cache)
    dialog.choose_script(str(script))
    dialog.env_edit.setPlainText("TF_MEMORY_ALLOCATION=0.5\nMY_SETTING=1")
    settle(dialog)
    assert dialog.env_warning.isVisibleTo(dialog)
    assert "TensorFlow does not read TF_MEMORY_ALLOCATION" in dialog.env_warning.text()
    assert dialog.launch_button.isEnabled()  # a warning, not an error
    dialog.env_edit.setPlainText("HEADROOM_JOB_ID=x")
    settle(dialog)
    assert "set by Headroom" in dialog.row_errors["env"].text()


def test_presets_fill_the_form(qtbot, paths, start_engine, probe_cache,  # type: ignore
                               script) -> None:
    engine = start_engine(demo=True)
    dialog = open_dialog(qtbot, paths, probe_cache)
    dialog.choose_script(str(script))
    with engine.client() as c:
        total = c.status().memory.total_bytes

    # desktop-safe (the default): GPU 0 drives the display, so 1024 MB stay free for it.
    assert dialog.preset_combo.currentData() == "desktop-safe"
    assert dialog.vram_mode.currentData() == "reserve" and dialog.vram_spin.value() == 1024
    assert dialog.growth_combo.currentData() is None
    assert dialog.ram_budget_edit.text() == f"{total * 75 // 100 // 1024**2} MiB"

    dialog.apply_preset("throughput")
    settle(dialog)
    assert dialog.growth_combo.currentData() is False
    assert dialog.vram_mode.currentData() == "none"
    assert dialog.allocator_combo.currentData() == "cuda_malloc_async"
    assert dialog.xla_combo.currentData() is True
    assert dialog.spec is not None and dialog.spec.preset == "throughput"

    dialog.apply_preset("cpu-only")
    settle(dialog)
    assert dialog.gpu_combo.currentData() == "cpu"
    assert dialog.spec is not None and dialog.spec.options.cpu_only
    assert dialog.summary_label.text().startswith("TensorFlow runs on the CPU only")

    # Changing an option by hand makes the form "Custom": no preset is recorded.
    dialog.xla_combo.setCurrentIndex(dialog.xla_combo.findData(False))
    settle(dialog)
    assert dialog.preset_combo.currentData() is None
    assert dialog.spec is not None and dialog.spec.preset is None


def test_show_command_is_the_dry_run_plan(qtbot, paths, start_engine, probe_cache,  # type: ignore
                                          script) -> None:
    start_engine()
    dialog = open_dialog(qtbot, paths, probe_cache)
    dialog.choose_script(str(script))
    dialog.apply_preset("cpu-only")
    dialog.args_edit.setText("--epochs 2")
    settle(dialog)
    qtbot.mouseClick(dialog.plan_button, Qt.MouseButton.LeftButton)
    assert dialog.plan_view.isVisibleTo(dialog)
    plan = dialog.plan_view.toPlainText()
    assert plan.startswith("Command:")
    assert f"{script} --epochs 2" in plan
    assert "CUDA_VISIBLE_DEVICES=-1" in plan
    assert dialog.plan_button.text() == "Hide command"
    dialog.args_edit.setText("--epochs 5")
    settle(dialog)
    assert f"{script} --epochs 5" in dialog.plan_view.toPlainText()


def test_launch_remembers_the_settings_for_the_script(qtbot, paths, start_engine,  # type: ignore
                                                      probe_cache, script, tmp_path) -> None:
    engine = start_engine()
    dialog = open_dialog(qtbot, paths, probe_cache)
    dialog.choose_script(str(script))
    dialog.apply_preset("cpu-only")
    dialog.args_edit.setText("--epochs 2")
    dialog.name_edit.setText("first run")
    dialog.ram_budget_edit.setText("3 GiB")
    dialog.vram_budget_edit.setText("")
    dialog.env_edit.setPlainText("MY_SETTING=1")
    ckpt = tmp_path / "ckpt"
    dialog.ckpt_edit.setText(str(ckpt))
    dialog.ckpt_every_spin.setValue(50)
    dialog.manual_resume_box.setChecked(True)
    settle(dialog)
    assert dialog.launch_button.isEnabled()
    with qtbot.waitSignal(dialog.launched, timeout=30000) as launched:
        qtbot.keyClick(dialog.args_edit, Qt.Key.Key_Return)  # Enter launches
    job = launched.args[0]
    assert dialog.result() == QDialog.DialogCode.Accepted
    with engine.client() as c:
        saved = c.job_get(job.id)
    assert saved.name == "first run"
    assert saved.spec["args"] == ["--epochs", "2"]
    assert saved.spec["options"]["cpu_only"] is True
    assert saved.spec["ram_budget_mb"] == 3072
    assert saved.spec["checkpoint_every_steps"] == 50
    assert saved.spec["auto_resume"] is False

    # A new dialog starts with the last script and its settings, and lists it as recent.
    again = open_dialog(qtbot, paths, probe_cache)
    assert again.script_combo.itemText(0) == str(script)
    assert again.script() == str(script)
    assert again.args_edit.text() == "--epochs 2"
    assert again.name_edit.text() == "first run"
    assert again.gpu_combo.currentData() == "cpu"
    assert again.preset_combo.currentData() == "cpu-only"
    assert again.ram_budget_edit.text() == "3072 MiB"
    assert again.env_edit.toPlainText() == "MY_SETTING=1"
    assert again.ckpt_edit.text() == str(ckpt)
    assert again.ckpt_every_spin.value() == 50
    assert again.manual_resume_box.isChecked()
    # Another script starts from the defaults.
    other = script.with_name("other.py")
    other.write_text("print('other')\n")
    again.choose_script(str(other))
    assert again.args_edit.text() == "" and again.preset_combo.currentData() == "desktop-safe"
    # Choosing the first one again (from the recent list) brings its settings back.
    again.script_combo.setCurrentIndex(0)
    again.script_combo.activated.emit(0)
    assert again.args_edit.text() == "--epochs 2"
    assert again.name_edit.text() == "first run"

    # The first dialog, opened again (the app keeps it), lists the recent script.
    dialog.show()
    assert dialog.script_combo.itemText(0) == str(script)
    assert dialog.launch_button.text() == "Launch" and dialog.launch_button.isEnabled()


def test_engine_error_shows_in_the_dialog(qtbot, paths, start_engine, probe_cache,  # type: ignore
                                          script) -> None:
    engine = start_engine()
    dialog = open_dialog(qtbot, paths, probe_cache)
    dialog.choose_script(str(script))
    settle(dialog)
    engine.stop()
    dialog.launch()
    qtbot.waitUntil(lambda: dialog.engine_label.isVisibleTo(dialog), timeout=15000)
    dialog.revalidate()  # the answer stays on screen while the form is checked again
    text = dialog.engine_label.text()
    assert text.startswith("The engine did not start the job: ")
    assert "Traceback" not in text and "\n" not in text
    assert dialog.isVisible() and dialog.launch_button.isEnabled()


def test_drop_a_script_and_cancel_with_escape(qtbot, paths, start_engine,  # type: ignore
                                              probe_cache, script) -> None:
    start_engine()
    dialog = open_dialog(qtbot, paths, probe_cache)
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(script))])
    event = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime,
                       Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    dialog.dropEvent(event)
    assert dialog.script() == str(script)
    settle(dialog)
    assert dialog.spec is not None
    with qtbot.waitSignal(dialog.finished, timeout=5000):
        qtbot.keyClick(dialog, Qt.Key.Key_Escape)
    assert dialog.result() == QDialog.DialogCode.Rejected


def test_interpreters_probed_in_the_background(qtbot, paths, start_engine,  # type: ignore
                                               probe_cache, script, tmp_path) -> None:
    start_engine()
    dialog = open_dialog(qtbot, paths, probe_cache)
    dialog.choose_script(str(script))
    assert dialog.busy_row.isVisibleTo(dialog)  # finding and probing take a while
    # The automatic choice is this Python (no venv beside the script), with TensorFlow.
    qtbot.waitUntil(lambda: "TensorFlow" in dialog.python_info.text(), timeout=120000)
    assert dialog.python_combo.currentData() == AUTO_PYTHON
    assert dialog.python_path() == sys.executable
    assert dialog.python_info.text().startswith(
        f"Python {sys.version_info[0]}.{sys.version_info[1]} · TensorFlow ")
    # A venv beside the script, without TensorFlow: found first, and the doctor says so.
    venv = script.parent / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    bare = str(venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python3"))
    other = script.with_name("train2.py")
    other.write_text("print(1)\n")
    dialog.choose_script(str(other))
    qtbot.waitUntil(lambda: dialog.python_path() == bare, timeout=60000)
    qtbot.waitUntil(lambda: "no TensorFlow" in dialog.python_info.text(), timeout=60000)
    qtbot.waitUntil(lambda: dialog.doctor_label.isVisibleTo(dialog), timeout=10000)
    assert "TensorFlow" in dialog.doctor_label.text()
    qtbot.waitUntil(lambda: not dialog.busy_row.isVisibleTo(dialog), timeout=120000)
    labels = [dialog.python_combo.itemText(i) for i in range(dialog.python_combo.count())]
    assert any(label.startswith(f"{bare} (venv beside the script)") for label in labels)
    assert json.loads((probe_cache / "interpreters.json").read_text())


def test_show_command_is_what_is_launched(qtbot, paths, start_engine, probe_cache,  # type: ignore
                                          tmp_path) -> None:
    """The plan the dialog shows and the job the engine starts have one environment: the job's
    variables are the plan's (the job channel's aside), also where the dialog's environment is
    not the engine's."""
    engine = start_engine()
    out = tmp_path / "env.json"
    script = tmp_path / "work" / "dump_env.py"
    script.parent.mkdir()
    script.write_text("import json, os, sys\n"
                      f"open({str(out)!r}, 'w').write(json.dumps(dict(os.environ)))\n")
    dialog = open_dialog(qtbot, paths, probe_cache)
    dialog.environ = {**dialog.environ, "ONLY_IN_THE_DIALOG": "shown and launched"}
    dialog.choose_script(str(script))
    dialog.apply_preset("cpu-only")
    dialog.env_edit.setPlainText("MY_SETTING=1")
    settle(dialog)
    assert dialog.spec is not None
    plan = dialog.launch_plan(dialog.spec)
    with qtbot.waitSignal(dialog.launched, timeout=30000) as launched:
        dialog.launch()
    job_id = launched.args[0].id
    with engine.client() as c:
        qtbot.waitUntil(lambda: c.job_get(job_id).state in ENDED, timeout=60000)
    seen = json.loads(out.read_text())

    def ours(env):  # type: ignore[no-untyped-def]
        return {k: v for k, v in env.items() if not k.startswith("HEADROOM_JOB_")}

    assert seen["ONLY_IN_THE_DIALOG"] == "shown and launched" and seen["MY_SETTING"] == "1"
    assert ours(seen) == ours(plan.env)


def test_out_of_memory_choice_reaches_the_spec_and_the_plan(qtbot, paths, start_engine,  # type: ignore
                                                             probe_cache, script) -> None:
    start_engine()
    dialog = open_dialog(qtbot, paths, probe_cache)
    dialog.choose_script(str(script))
    spec = dialog.form_spec()
    assert (spec.on_oom, spec.min_batch) == ("shrink", None)  # the defaults
    select(dialog.on_oom_combo, "stop")
    dialog.min_batch_spin.setValue(16)
    settle(dialog)
    spec = dialog.form_spec()
    assert (spec.on_oom, spec.min_batch) == ("stop", 16)
    qtbot.mouseClick(dialog.plan_button, Qt.MouseButton.LeftButton)
    assert "stop: the job fails, as without Headroom" in dialog.plan_view.toPlainText()
    dialog.reset_options(keep_script=True)
    assert dialog.form_spec().on_oom == "shrink"
    dialog.fill_from_spec(spec)  # a relaunch, or the script's last settings
    assert (dialog.form_spec().on_oom, dialog.form_spec().min_batch) == ("stop", 16)
    assert form_row(SpecError("--min-batch: 0 is not a batch size", sv.MIN_BATCH)) == "on_oom"
