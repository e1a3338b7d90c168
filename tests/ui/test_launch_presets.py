"""One "desktop-safe": the launch dialog, ``headroom run --preset desktop-safe --dry-run`` (with
and without --demo) and the README give the same plan for the same GPUs. Growth when no GPU of
the job drives a display; when one does, 1024 MB left free on each of the job's GPUs and no
growth (TensorFlow cannot have both on a GPU, and one choice holds for all of a job's GPUs).
And with an interpreter whose TensorFlow cannot use a GPU, the dialog says the GPU options do
nothing rather than promising them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List

import pytest

from tests.conftest import REPO, run_cli
from tests.ui.test_launch_dialog import open_dialog, probe_cache, script, settle  # noqa: F401
from trayapp.jobs import spec_values as sv
from trayapp.jobs.interpreters import Interpreter
from trayapp.jobs.options import JobSpec, MemoryOptions, apply_preset
from trayapp.readings import gpu_readings
from trayapp.ui.launch_plan import summary_text
from trayapp.ui.launch_python import cpu_tensorflow, gpu_warning

pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")
GiB = 1024**3


def _section(plan: str, start: str, end: str) -> List[str]:
    lines = plan.splitlines()
    i = lines.index(start)
    j = lines.index(end, i)
    return lines[i:j]


def tensorflow_part(plan: str) -> List[str]:
    """What the plan does to TensorFlow: the GPU variables and the runner's steps (the job's
    own paths and ids, which differ between a dry run and the dialog, left out)."""
    env = [line for line in _section(plan, "Environment set by Headroom:", "Process:")
           if "HEADROOM_" not in line and "PYTHON" not in line]
    return env + _section(plan, "Inside TensorFlow, before the script's code:",
                          "Out of memory in fit():")


@pytest.mark.parametrize("demo", [True, False])
def test_the_dialog_and_a_dry_run_give_one_plan(qtbot, paths, start_engine,  # type: ignore
                                                probe_cache, script, demo) -> None:  # noqa: F811
    engine = start_engine(demo=demo)
    dialog = open_dialog(qtbot, paths, probe_cache)
    dialog.choose_script(str(script))
    settle(dialog)
    assert dialog.preset_combo.currentData() == "desktop-safe"
    dialog.python_choice.show_spec_python(sys.executable)
    settle(dialog)
    assert dialog.spec is not None
    shown = dialog.plan_text()
    args = ["--demo"] if demo else []
    r = run_cli(*args, "run", "--preset", "desktop-safe", "--python", sys.executable,
                "--dry-run", str(script), env={"HEADROOM_HOME": str(paths.home)}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert tensorflow_part(shown) == tensorflow_part(r.stdout)
    with engine.client() as c:
        gpus = c.status().gpus
    if demo:  # simulated: GPU 0 drives a display, GPU 1 does not
        assert any(g.display_active for g in gpus)
        assert dialog.vram_mode.currentData() == "reserve" and dialog.vram_spin.value() == 1024
        assert "memory growth" not in "\n".join(tensorflow_part(shown))
    else:
        assert dialog.growth_combo.currentData() is True
        assert "TF_FORCE_GPU_ALLOW_GROWTH=true" in shown


def test_the_preset_does_what_the_readme_says() -> None:
    said = sv.PRESETS["desktop-safe"]
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    assert f"`desktop-safe` ({said})" in readme
    display = {"index": 0, "memory_total_bytes": 8 * GiB, "display_active": True}
    compute = {"index": 1, "memory_total_bytes": 16 * GiB, "display_active": False}
    both = apply_preset(JobSpec(script="t.py"), "desktop-safe", gpu_readings([display, compute]))
    assert (both.options.vram_reserve_mb, both.options.memory_growth) == (1024, None)
    alone = apply_preset(JobSpec(script="t.py", options=MemoryOptions(gpus=(1,))),
                         "desktop-safe", gpu_readings([display, compute]))
    assert (alone.options.vram_reserve_mb, alone.options.memory_growth) == (None, True)
    assert "memory growth" in said and "each of the job's GPUs" in said and "75%" in said


def test_a_cpu_build_is_not_promised_gpu_caps(tmp_path: Path) -> None:
    cpu = Interpreter(path="/p", python_version="3.11.2", tf_version="2.21.0",
                      is_cuda_build=False, gpus_seen=0)
    blind = Interpreter(path="/p", python_version="3.11.2", tf_version="2.21.0",
                        is_cuda_build=True, gpus_seen=0)
    fine = Interpreter(path="/p", python_version="3.11.2", tf_version="2.21.0",
                       is_cuda_build=True, gpus_seen=1)
    assert cpu_tensorflow(cpu) and cpu_tensorflow(blind)
    assert not cpu_tensorflow(fine) and not cpu_tensorflow(None)
    assert not cpu_tensorflow(Interpreter(path="/p", python_version="3.11.2"))  # no TF at all
    assert "is a CPU build" in gpu_warning(cpu) and "do nothing" in gpu_warning(cpu)
    gpu = {"index": 0, "memory_total_bytes": 8 * GiB, "memory_free_bytes": 7 * GiB,
           "display_active": True}
    gpus = gpu_readings([gpu])
    spec = apply_preset(JobSpec(script="/x/t.py"), "desktop-safe", gpus)
    promised = summary_text(spec, gpus)
    assert promised.startswith("TensorFlow may use at most 7.0 GiB of GPU 0")
    honest = summary_text(spec, gpus, cpu_tensorflow=True)
    assert honest.startswith("This interpreter's TensorFlow runs on the CPU only, so the GPU "
                             "options do nothing")
    assert "GPU 0" not in honest


def test_the_dialog_warns_with_a_cpu_build(qtbot, paths, start_engine,  # type: ignore
                                           probe_cache, script) -> None:  # noqa: F811
    start_engine(demo=True)  # the engine sees GPUs; the tests' TensorFlow is a CPU build
    dialog = open_dialog(qtbot, paths, probe_cache)
    dialog.choose_script(str(script))
    qtbot.waitUntil(lambda: "TensorFlow" in dialog.python_info.text(), timeout=120000)
    assert cpu_tensorflow(dialog.python_choice.chosen())
    qtbot.waitUntil(lambda: "GPU options" in dialog.doctor_label.text(), timeout=10000)
    assert dialog.doctor_label.isVisibleTo(dialog)
    settle(dialog)
    assert dialog.summary_label.text().startswith("This interpreter's TensorFlow runs on the "
                                                  "CPU only")
