"""Where an out-of-memory error of fit() happened, from what TensorFlow says, and whether training
may go on in the process that failed (``shrink.oom_site``, ``Shrinker.trusted``), with the texts
of real errors (tensorflow-cpu 2.21 under an address-space limit; a GPU's from TensorFlow's
BFC allocator; the issue's, inside Adam's update)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from trayapp.runner import fithook, shrink, tfoptions

CPU_BACKWARD = """Graph execution error:

Detected at node gradient_tape/sequential_1/dense_2_1/MatMul/MatMul defined at (most recent \
call last):
  File "adam_oom.py", line 13, in <module>

OOM when allocating tensor with shape[8192,4096] and type float on \
/job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu
\t [[{{node gradient_tape/sequential_1/dense_2_1/MatMul/MatMul}}]]
Hint: If you want to see a list of allocated tensors when OOM happens, add \
report_tensor_allocations_upon_oom to RunOptions for current allocation info. \
[Op:__inference_multi_step_on_iterator_1234]"""

CPU_FORWARD = """Graph execution error:

Detected at node sequential_1/dense_1_2/Relu defined at (most recent call last):
OOM when allocating tensor with shape[4096,2048] and type float on \
/job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu
\t [[{{node sequential_1/dense_1_2/Relu}}]]"""

GPU_IN_ADAM = """Graph execution error:

Detected at node adam/cond/Square_2 defined at (most recent call last):
OOM when allocating tensor with shape[4096,4096] and type float on \
/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc
\t [[{{node adam/cond/Square_2}}]]"""

GPU_FORWARD = """OOM when allocating tensor with shape[256,64,112,112] and type float on \
/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc
\t [[{{node functional_1/conv2d_1/convolution}}]]"""

RAISED_BY_PYTHON = "OOM when allocating tensor with shape[64,16] (raised by the test)"


def error(text: str) -> Exception:
    return type("ResourceExhaustedError", (Exception,), {})(text)


ADAM = SimpleNamespace(name="adam")


@pytest.mark.parametrize("text,device,node,in_update,backward", [
    (CPU_BACKWARD, shrink.HOST, "gradient_tape/sequential_1/dense_2_1/MatMul/MatMul", False,
     True),
    (CPU_FORWARD, shrink.HOST, "sequential_1/dense_1_2/Relu", False, False),
    (GPU_IN_ADAM, shrink.GPU, "adam/cond/Square_2", True, False),
    (GPU_FORWARD, shrink.GPU, "functional_1/conv2d_1/convolution", False, False),
    (RAISED_BY_PYTHON, None, None, False, False),
])
def test_the_device_and_the_node_are_read_from_tensorflows_words(
        text: str, device: Any, node: Any, in_update: bool, backward: bool) -> None:
    site = shrink.oom_site(error(text), ADAM)
    assert (site.device, site.node, site.in_update, site.backward) == \
        (device, node, in_update, backward)


def test_a_memory_error_is_the_hosts() -> None:
    site = shrink.oom_site(MemoryError("Unable to allocate 3.2 GiB for an array"), ADAM)
    assert site.device == shrink.HOST and not site.in_update


def test_the_runners_own_ops_in_the_update_count_as_the_optimizers() -> None:
    text = GPU_FORWARD.replace("functional_1/conv2d_1/convolution", "headroom_exact/cond/mul_3")
    assert shrink.oom_site(error(text), ADAM).in_update
    # A layer of the user's called "adam_block" is not the optimizer named "adam".
    text = GPU_FORWARD.replace("functional_1/conv2d_1/convolution", "adam_block/dense/MatMul")
    assert not shrink.oom_site(error(text), ADAM).in_update


def shrinker(atomic: bool) -> Any:
    s = shrink.Shrinker.__new__(shrink.Shrinker)
    s.model = SimpleNamespace(optimizer=SimpleNamespace(_headroom_atomic=atomic))
    return s


@pytest.mark.parametrize("text,atomic,trusted,fresh", [
    # In the update: never trusted; relaunched from the last checkpoint.
    (GPU_IN_ADAM, True, False, "in its update"),
    # A gradient of a step that is not atomic: later layers may be updated.
    (CPU_BACKWARD, False, False, "may have updated some layers"),
    # Atomic: the weights are those of the last update, but the host's allocation failed.
    (CPU_BACKWARD, True, True, "an allocation failed on the host"),
    (CPU_FORWARD, False, True, "an allocation failed on the host"),
    # A GPU's memory in the forward pass, or an error raised by Python: trained on in place.
    (GPU_FORWARD, False, True, None),
    (RAISED_BY_PYTHON, False, True, None),
])
def test_where_training_goes_on(text: str, atomic: bool, trusted: bool, fresh: Any) -> None:
    site = shrink.oom_site(error(text), ADAM)
    assert shrinker(atomic).trusted(site) is trusted
    why = fithook._fresh_process(site, trusted)
    assert (why is None) if fresh is None else (fresh in why)


def test_the_relaunch_option_is_read_and_checked() -> None:
    options = tfoptions.read_options('{"relaunch": {"fit": 2, "accumulation": 4}}')
    assert options["relaunch"] == {"fit": 2, "accumulation": 4, "temporary": False}
    assert tfoptions.read_options("{}")["relaunch"] is None
    for bad in ('{"relaunch": {"fit": 0, "accumulation": 4}}',
                '{"relaunch": {"fit": 1, "accumulation": 1}}',
                '{"relaunch": {"fit": 1, "accumulation": true}}',
                '{"relaunch": {"fit": 1, "accumulation": 2, "temporary": "yes"}}',
                '{"relaunch": [1, 2]}'):
        with pytest.raises(tfoptions.OptionError, match="relaunch"):
            tfoptions.read_options(bad)
