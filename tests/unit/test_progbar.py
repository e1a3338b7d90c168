"""Where a parked or stopped fit says it stopped (``runner.progbar.stop_line``), and when the
runner puts its own Keras bar in a fit (``wanted``)."""

from __future__ import annotations

import inspect

from trayapp.runner import progbar


def test_a_stop_inside_an_epoch_names_the_batch_and_the_epoch() -> None:
    assert progbar.stop_line("parked", (1, 306, 313), 5) == \
        "parked at batch 306 of 313 (epoch 2 of 5)"
    assert progbar.stop_line("stopped", (0, 0, 313), 5) == \
        "stopped at batch 0 of 313 (epoch 1 of 5)"
    assert progbar.stop_line("parked", (0, 7, None), None) == "parked at batch 7 (epoch 1)"


def test_a_stop_between_epochs_names_the_last_whole_epoch() -> None:
    assert progbar.stop_line("parked", (2, 0, 313), 5) == "parked after epoch 2 of 5"
    assert progbar.stop_line("stopped", (2, 313, 313), 5) == "stopped after epoch 3 of 5"


class ProgbarLogger:
    def _finalize_progbar(self, logs):  # the method the runner's bar relies on
        pass


def bound(**arguments):
    def fit(verbose="auto", callbacks=None):
        pass

    return inspect.signature(fit).bind(**arguments)


def test_the_bar_is_the_runners_only_where_keras_would_draw_its_own() -> None:
    assert progbar.wanted(bound(), None)
    assert progbar.wanted(bound(verbose=1), [])
    assert not progbar.wanted(bound(verbose=0), None)
    assert not progbar.wanted(bound(verbose=1), [ProgbarLogger()])  # the user's own bar
