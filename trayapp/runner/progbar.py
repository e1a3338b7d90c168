"""Keras's progress bar (``verbose=1``) as the user's fit would draw it: counting the user's
batches when the fit trains micro-batches, and left where training stopped when it was parked or
stopped inside an epoch (Keras would close it at the epoch's last batch).

The fit hook puts this bar in the fit's callbacks when Keras would add its own (``verbose`` not
0) and the user's callbacks have none: Keras then uses it instead of adding one.

Stdlib only: the class is built from the Keras the script imported.
"""


def bar_class(callbacks_module):
    """A ``ProgbarLogger`` that counts the user's batches; None without one in this Keras."""
    base = getattr(callbacks_module, "ProgbarLogger", None)
    if base is None or not hasattr(base, "_finalize_progbar"):
        return None

    class Bar(base):
        def __init__(self, run):
            super().__init__()
            self._run = run

        def set_params(self, params):
            super().set_params(params)
            acc = self._run.accumulation
            if acc > 1 and self.target:
                self.target = -(-int(self.target) // acc)  # the user's batches of the epoch

        def on_train_batch_end(self, batch, logs=None):
            acc = self._run.accumulation
            if acc > 1:
                steps = self._run.steps
                last = steps is not None and batch + 1 >= steps
                if (batch + 1) % acc and not last:
                    return  # inside one of the user's batches
                batch //= acc
            where = self._run.stopped_at
            if where is not None and batch + 1 > where[1]:
                return  # a batch Keras trains after the park or stop landed: not drawn
            super().on_train_batch_end(batch, logs)

        def on_epoch_end(self, epoch, logs=None):
            where = self._run.stopped_at
            if where is None or where[0] != epoch or where[1] >= where[2] or self.progbar is None:
                super().on_epoch_end(epoch, logs)
                return
            # Ended inside the epoch: the bar stays at the batches done (what a resume
            # continues from), not at the epoch's last.
            self.progbar.update(where[1], list((logs or {}).items()), finalize=True)

    return Bar


def wanted(bound, user):
    """Whether the fit draws Keras's bar and the user's callbacks have none of their own."""
    verbose = bound.arguments.get("verbose", "auto")
    if verbose == 0 or verbose is False:
        return False
    return not any(
        type(c).__name__ == "ProgbarLogger" or hasattr(c, "_finalize_progbar") for c in user or ()
    )


def stop_line(how, where, epochs):
    """``"parked at batch 306 of 313 (epoch 2 of 5)"``, or ``"stopped after epoch 2 of 5"``."""
    epoch, done, steps = where
    of_epochs = f" of {epochs}" if epochs else ""
    if steps and done >= steps or not done and epoch:
        finished = epoch + (1 if steps and done >= steps else 0)
        return f"{how} after epoch {finished}{of_epochs}"
    of_steps = f" of {steps}" if steps else ""
    return f"{how} at batch {done}{of_steps} (epoch {epoch + 1}{of_epochs})"
