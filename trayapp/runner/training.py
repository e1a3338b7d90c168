"""The ``keras.Model.fit`` hook: progress, cooperative pause, checkpoints, park and stop.

The hook adds callbacks around the user's own (theirs still run, in their order) and acts only at
batch boundaries, on the training thread, where the weights are consistent.

Checkpoints (Keras 3) use the files ``keras.callbacks.BackupAndRestore`` restores:
``<checkpoint_dir>/fit-<n>/latest.weights.h5`` (weights and optimizer state, so the optimizer's
step count and learning-rate schedule continue) and ``training_metadata.json`` (``epoch``: the epoch
to start from). Each ``fit()`` call of the script gets its own ``fit-<n>`` folder, numbered in call
order, so a script with several fits resumes each one (a finished fit restores its weights and
trains no more epochs).

Keras can only start an epoch from its first batch. So that a park or a checkpoint in the middle of
an epoch loses nothing and repeats nothing, the metadata also records how many batches of that
epoch were done (``headroom.batches_done``); on resume (TensorFlow backend) the runner fetches and
drops that many batches of the restarted epoch instead of training on them, so at most the batches
since the last checkpoint are trained twice. On other backends the restarted epoch is trained
from its first batch.

The metadata keeps the fit's History too (``headroom.history``: every whole epoch's number and
logs), so a resumed ``fit()`` returns the History of the whole training, and, for a checkpoint
saved inside an epoch, the training metrics' state (``headroom.metrics``: each metric's
variables, a mean's total and count), put back as the resumed epoch begins, so its logs cover the
whole epoch.

Park and stop both save where training is (with a checkpoint folder) and end ``fit()`` at the
batch; the job then exits (``PARK_EXIT_CODE`` / ``STOP_EXIT_CODE``) without running the rest of
the script, and the checkpoint stays resumable. A stop without a checkpoint folder ends the same
way, with nothing saved.
"""

import math
import os
import sys
import time

from . import checkpoint, forecast, layout, metricstate, progbar, protocol, shrink
from .checkpoint import drop_checkpoints as drop_checkpoints
from .control import Parked, Stopped
from .tfoptions import gpu_memory

_PROGRESS_SECONDS = 0.25


# ---------------------------------------------------------------------------------------------
# One fit() call


def _clean_logs(logs):
    out = {}
    bad = []
    for key, value in (logs or {}).items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            out[str(key)] = number
        else:
            out[str(key)] = None
            bad.append(str(key))
    return out, bad


def _int(value, default):
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


class FitRun:
    """The state of one hooked ``fit()`` call, driven by its callbacks."""

    def __init__(self, session, model, index, epochs, keras3, tf_backend, initial_epoch=0):
        self.session = session
        self.model = model
        self.index = index
        self.epochs = epochs
        self.initial_epoch = _int(initial_epoch, 0)
        self.keras3 = keras3
        self.tf_backend = tf_backend
        options = session.options
        base = options["checkpoint_dir"]
        self.dir = os.path.join(base, layout.fit_dir_name(index)) if base else None
        self.every = options["checkpoint_every_steps"]
        self.steps = None
        self.k = 1
        self.epoch = 0
        self.position = (0, 0)  # (epoch to start from, batches of it done) if saved now
        self.stopping = False
        self.stop_seen = False
        self.trained = 0
        self.since_save = 0
        self.skip = 0
        self.skip_epoch = None
        self.skipping = False
        self.restored_finished = False
        self.last_saved = None
        self.gpu_names = []
        self.accumulation = 1  # micro-batches per optimizer update (shrunk: > 1)
        self.batch = None  # (effective batch, micro-batch), when known
        self.shrinkable = False  # the engine may relaunch it at a smaller micro-batch
        self.shrinker = None  # what changes its micro-batch (runner.shrink.Shrinker)
        self.epoch_updates = None  # the optimizer's updates when this epoch began
        self.in_memory = False  # trained on after an out-of-memory error, not from a checkpoint
        # The batch of this epoch whose step is under way (set before the user's callbacks):
        # if it fails, the batches before it are done.
        self.begun = None
        self.forecast_sent = False
        self.step_meter = None  # the forecast from the first steps (runner.forecast)
        # Every whole epoch of this fit so far, [epoch, logs], the ones a checkpoint brought
        # back first: saved with each checkpoint, and the History fit() returns has them.
        self.epochs_done = []
        self._attempt_begun = False  # the History of this fit() attempt has the earlier epochs
        self.metric_state = None  # (epoch, {metric: [values]}) to put back as it begins
        # Where a park or stop ended this fit: (epoch, the user's batches done, of how many)
        self.stopped_at = None
        self.keeper = None  # the metrics' state as each update began (runner.metricstate)
        self._progress_epoch = 1 << 30  # the epoch whose beginning the progress said
        self._last_progress = 0.0
        self._bad_logs_noted = False

    # -- checkpoint files -------------------------------------------------------------------

    def prepare_folder(self):
        """Without --resume a job starts fresh: its first fit() drops the old checkpoint (every
        ``fit-<n>`` folder, so no later fit resumes from an older run), each later one its own
        folder. Done here, as training starts, so a run that never gets there loses nothing."""
        if not self.dir or self.session.options["resume"]:
            return
        base = os.path.dirname(self.dir)
        if self.index == 1 and os.path.isdir(base):
            for name in os.listdir(base):
                if layout.parse_fit_dir(name) is not None:
                    checkpoint.drop_checkpoint(os.path.join(base, name))
        else:
            checkpoint.drop_checkpoint(self.dir)

    def read_metadata(self):
        return checkpoint.read_metadata(self.dir)

    def save(self, epoch, done, reason, finished=False, metrics=None):
        """Write the files BackupAndRestore restores; returns True when saved. ``metrics``: the
        training metrics' state to keep (default: as they are now, inside an epoch, but after
        an out-of-memory error, when they may count part of the failed step)."""
        if not self.dir:
            return False
        try:
            metadata = {
                "epoch": epoch,
                "batch": max(done - 1, 0),
                "headroom": {
                    "batches_done": done,
                    "accumulation": self.accumulation,
                    "finished": finished,
                    "fit": self.index,
                    "time": time.time(),
                    "history": [[e, logs] for e, logs in self.epochs_done if e < epoch],
                },
            }
            if metrics is None and done and reason != protocol.SAVED_OOM:
                metrics = metricstate.state(self.model)
            if done and metrics:
                metadata["headroom"]["metrics"] = metrics
            checkpoint.write(self.model, self.dir, metadata)
        except Exception as e:
            self.session.note(protocol.NOTE_ERROR, f"checkpoint failed: {_first_line(e)}")
            return False
        self.since_save = 0
        self.last_saved = (epoch, done)
        self.session.send(
            protocol.make(
                protocol.CHECKPOINTED,
                path=self.dir,
                epoch=epoch,
                step=done // self.accumulation,
                fit=self.index,
                reason=reason,
            )
        )
        return True

    # -- what the engine asked for ----------------------------------------------------------

    def request_stop(self, save=True):
        """End fit() at this batch, after saving where training is (with a checkpoint folder,
        once this fit trained something: else what is on disk is already where it stands)."""
        if not self.keras3:
            raise Stopped()  # as for park: Keras 2 would record the stopped epoch as done
        epoch, done = self.position
        self._stop_here(epoch, done)
        if save and self.dir is not None and self.trained:
            self.save(epoch, done, protocol.SAVED_STOP)
        self.stopping = True
        self.model.stop_training = True

    def park(self):
        if not self.keras3:
            # Keras 2's BackupAndRestore would record a stopped epoch as done: end fit() now and
            # keep its last own checkpoint.
            raise Parked()
        epoch, done = self.position
        self._stop_here(epoch, done)
        if self.dir is None:
            self.session.note(
                protocol.NOTE_WARN, "no checkpoint folder: parked without a checkpoint"
            )
        else:
            done = self._to_smaller(done)
            self.save(epoch, done, protocol.SAVED_PARK)
        self.stopping = True
        self.model.stop_training = True

    def _stop_here(self, epoch, done):
        """Keep where this fit ends (in the user's batches) for its bar and its log."""
        acc = self.accumulation
        steps = -(-self.steps // acc) if self.steps is not None else None
        self.stopped_at = (
            epoch,
            done // acc if steps is None else min(steps, -(-done // acc)),
            steps,
        )

    def checkpoint_on_request(self, paused):
        if not self.keras3:
            self.session.note(protocol.NOTE_WARN, "checkpoint on request needs Keras 3")
            return
        if self.dir is None:
            self.session.note(protocol.NOTE_WARN, "no checkpoint folder: nothing saved")
            return
        self.session.send_state(protocol.STATE_CHECKPOINTING)
        epoch, done = self.position
        self.save(epoch, done, protocol.SAVED_REQUEST)
        self.session.send_state(protocol.STATE_PAUSED if paused else protocol.STATE_RUNNING)

    # -- callbacks --------------------------------------------------------------------------

    def train_begin(self, params):
        self.steps = params.get("steps")
        self.epochs = params.get("epochs", self.epochs)
        self.k = max(1, _int(getattr(self.model, "steps_per_execution", 1), 1))
        # Keras starts from the restored epoch, else from fit(initial_epoch=...).
        start = _int(getattr(self.model, "_initial_epoch", None), 0) or self.initial_epoch
        self.epoch = start
        self.position = (start, 0)
        self._attempt_begun = False
        if self.dir and self.keras3 and not self.in_memory:
            metadata = self.read_metadata()
            extra = metadata.get("headroom") if metadata else None
            if isinstance(extra, dict) and metadata.get("epoch") == start:
                self.restored_finished = bool(extra.get("finished"))
                self.epochs_done = [
                    [e, logs] for e, logs in checkpoint.saved_history(metadata) if e < start
                ]
                done = _int(extra.get("batches_done"), 0)
                if done > 0 and not self.restored_finished:
                    if self.tf_backend and done % self.k == 0:
                        self.skip, self.skip_epoch = done, start
                        if isinstance(extra.get("metrics"), dict):
                            self.metric_state = (start, extra["metrics"])
                    else:
                        self.session.note(
                            protocol.NOTE_INFO,
                            f"epoch {start + 1} restarts from its first batch ({done} were done)",
                        )
        if self.metric_state is not None:
            metricstate.build(self.model, self.shrinker)
        if self.shrinker is not None:
            if not self.in_memory and getattr(self.model.optimizer, "built", False):
                shrink.empty_at_boundary(self.model.optimizer)
            self.shrinker.flush_after(self._last_step)
        tf = sys.modules.get("tensorflow")
        self.gpu_names = forecast.gpu_names(tf)
        self._start_forecast(tf)
        # The batch and whether the fit can shrink, said before its first step: a step held
        # at the job's memory limit never ends, and the engine relaunches it smaller.
        self._progress(start, 0, None, now=True)
        self._progress_epoch = start
        if self.session.control.stop:
            self.request_stop(save=False)

    def _last_step(self):
        """The micro-step just trained was the epoch's last."""
        steps, begun = self.steps, self.begun
        return steps is not None and begun is not None and begun + self.k >= steps

    def epoch_begin(self, epoch):
        self.epoch = epoch
        self.position = (epoch, 0)
        if not self._attempt_begun:
            self._attempt_begun = True
            checkpoint.prepend_history(
                getattr(self.model, "history", None),
                [[e, logs] for e, logs in self.epochs_done if e < epoch],
            )
        if self.metric_state is not None:
            saved_epoch, state = self.metric_state
            self.metric_state = None
            if saved_epoch == epoch and not metricstate.put(self.model, state):
                self.session.note(
                    protocol.NOTE_INFO,
                    f"epoch {epoch + 1}'s metrics cover the batches "
                    "trained after the checkpoint only (a metric's state "
                    "could not be restored)",
                )
        skipped = self.skip if self.skip and epoch == self.skip_epoch else 0
        self.epoch_updates = self._updates() - skipped // self.accumulation
        self.begun = skipped if skipped else None
        if self.skip and epoch == self.skip_epoch:
            self._start_skip()
        if epoch > self._progress_epoch:
            # Said as it begins: the last progress was the end of the epoch before.
            self._last_progress = time.monotonic()
            self._progress(epoch, skipped, None, now=True)
        self._progress_epoch = epoch
        if self.session.control.pending and not self.skipping:
            self.session.control.serve(self)

    def batch_begin(self, batch, logs=None):
        # Called on every batch (the progress callback's own method): the quiet case, nothing
        # to save or serve, reads a few attributes and sets the position.
        if self.skipping:
            return
        if self.step_meter is not None:
            self._forecast_step()
        epoch, k = self.epoch, self.k
        if self.every and self.since_save >= self.every and self.keras3:
            self.position = (epoch, batch)
            self.save(epoch, batch, protocol.SAVED_INTERVAL)
        control = self.session.control
        if control.pending:
            self.position = (epoch, batch)
            control.serve(self)
            if self.stopping:
                return  # parked or stopped here: the batch Keras still trains is not counted
        done = batch + k
        steps = self.steps
        self.position = (epoch + 1, 0) if steps is not None and done >= steps else (epoch, done)
        self.since_save += k
        self.trained += k

    def batch_end(self, batch, logs=None):
        # May run on Keras's callback thread: only read state and queue a message here.
        now = time.monotonic()
        if now - self._last_progress < _PROGRESS_SECONDS or self.skipping:
            return
        self._last_progress = now
        self._progress(self.epoch, batch + 1, logs)

    def test_batch_begin(self):
        if self.session.control.pending and not self.skipping:
            self.session.control.serve(self)

    def epoch_end(self, epoch, logs):
        epoch_done, done = self.position
        complete = epoch_done == epoch + 1 or (self.steps is None and not self.stop_seen)
        if complete:
            self.position = (epoch + 1, 0)
            self.epochs_done = [[e, v] for e, v in self.epochs_done if e != epoch]
            self.epochs_done.append([epoch, checkpoint.epoch_logs(logs)])
            if self.steps is None and done:
                self.steps = done
            if (
                self.dir
                and self.keras3
                and not self.every
                and not self.stopping
                and not self.session.control.parked
            ):
                self.save(
                    epoch + 1, 0, protocol.SAVED_EPOCH, finished=epoch + 1 >= (self.epochs or 0)
                )
        self._last_progress = time.monotonic()
        self._progress(epoch, self.steps if complete else done, logs, now=True)
        if self.session.control.pending:
            self.session.control.serve(self)

    def train_end(self, logs):
        if self.stopped_at is not None and (self.stopping or self.session.control.parked):
            how = "parked" if self.session.control.park else "stopped"
            # In the log, after Keras's bar: where training stopped, which it does not say.
            sys.stderr.write(f"headroom: {progbar.stop_line(how, self.stopped_at, self.epochs)}\n")
            sys.stderr.flush()
        if not self._attempt_begun:  # a finished fit restored: no epoch left to train
            self._attempt_begun = True
            checkpoint.prepend_history(getattr(self.model, "history", None), self.epochs_done)
        if self.session.control.parked or self.stopping or not self.keras3 or not self.dir:
            return  # parked or stopped: the checkpoint says where training stands
        if self.last_saved == (self.epochs, 0) or (self.restored_finished and not self.trained):
            return
        # A finished fit (also one the script's own callbacks stopped early): a resumed script
        # restores these weights and trains no more epochs of it.
        self.save(self.epochs, 0, protocol.SAVED_END, finished=True)

    def _to_smaller(self, done):
        """A park to relaunch smaller: switch to the new accumulation here, at an update
        boundary, so the checkpoint holds the optimizer as the relaunch sets it up (the
        accumulators included) and the batches done in the new micro-batches. Returns them."""
        k = self.session.control.park_accumulation
        if not k or k <= self.accumulation or self.shrinker is None:
            return done
        updates = done // self.accumulation
        try:
            self.shrinker.switch(k)
        except Exception as e:  # Keras 2, an optimizer without accumulation
            self.session.note(protocol.NOTE_WARN, f"cannot shrink at the park: {_first_line(e)}")
            return done
        self.accumulation = k
        return updates * k

    # -- after an out-of-memory error ---------------------------------------------------------

    def _updates(self):
        try:
            return int(self.model.optimizer.iterations)
        except Exception:  # no optimizer yet, or one without a counter
            return 0

    def updates_done(self):
        """(epoch, optimizer updates done in it): where training stands after a failed step,
        from the batches begun before it (a step that fails may have advanced the optimizer's
        counter when its steps are not atomic). The counter is set back to match."""
        if self.epoch_updates is None:
            return self.epoch, 0
        done = (self.begun or 0) // self.accumulation
        try:
            optimizer = self.model.optimizer
            optimizer._iterations.assign((self.epoch_updates + done) * self.accumulation)
        except Exception:  # no optimizer, or one without a counter
            pass
        return self.epoch, done

    def kept_metrics(self):
        """The training metrics' state as the last whole update ended (after an out-of-memory
        error: that of the batches done), or None when it is not kept."""
        return (self.keeper.state() or None) if self.keeper is not None else None

    def restart_in_memory(self, epoch, updates, accumulation):
        """Train on from ``epoch`` with ``updates`` of it done, at ``accumulation`` micro-batches
        an update: the next fit() attempt drops the micro-batches already trained, its metrics
        put back as they were when the last whole update ended."""
        kept = self.kept_metrics() if updates else None
        if kept is not None:
            self.metric_state = (epoch, kept)
        self.accumulation = accumulation
        self.in_memory = True
        self.initial_epoch = epoch
        self.skip, self.skip_epoch = updates * accumulation, epoch
        self.stop_seen = False
        self.forecast_sent = False  # measured again at the new micro-batch

    # -- the forecast ---------------------------------------------------------------------------

    def _start_forecast(self, tf):
        if self.forecast_sent or not self.batch and self.shrinker is None:
            return
        micro = self.batch[1] if self.batch else None
        if micro is None and self.shrinker is not None:
            micro = self.shrinker.micro()
        if not micro:
            return
        self.step_meter = forecast.StepMeter(forecast.Meter(tf, self.gpu_names), micro, self.steps)
        self._trained_at_start = self.trained

    def _forecast_step(self):
        devices = self.step_meter.step(self.trained - self._trained_at_start)
        if devices is None:
            return
        meter, self.step_meter = self.step_meter, None
        self.forecast_sent = True
        if not devices:
            return
        batch = self.batch[0] if self.batch else meter.micro
        self.session.send(
            protocol.make(
                protocol.FORECAST,
                fit=self.index,
                how=forecast.STEPS,
                batch=batch,
                micro_batch=meter.micro,
                accumulation=self.accumulation,
                devices=devices,
                accumulators=[
                    {"device": d, "bytes": b}
                    for d, b in forecast.accumulator_bytes(self.model, self.gpu_names).items()
                ],
            )
        )

    # -- helpers ----------------------------------------------------------------------------

    def _progress(self, epoch, step, logs, now=False):
        values, bad = _clean_logs(logs)
        if bad and not self._bad_logs_noted:
            self._bad_logs_noted = True
            self.session.note(
                protocol.NOTE_WARN, "{} is not a number (NaN or inf)".format(", ".join(bad))
            )
        memory = None
        if self.gpu_names:
            tf = sys.modules.get("tensorflow")
            memory = gpu_memory(tf, self.gpu_names) if tf is not None else None
        acc = self.accumulation
        shrunk = {"shrinkable": self.shrinkable}
        if self.batch:
            shrunk.update(batch=self.batch[0], micro_batch=self.batch[1], accumulation=acc)
        self.session.send_progress(
            protocol.make(
                protocol.PROGRESS,
                fit=self.index,
                epoch=epoch + 1,
                epochs=self.epochs,
                step=step // acc if step is not None else None,
                steps=-(-self.steps // acc) if self.steps is not None else None,
                logs=values,
                tf_memory=memory,
                **shrunk,
            ),
            now,
        )

    def _start_skip(self):
        """Drop the batches of the restarted epoch that were trained before the checkpoint."""
        model = self.model
        original = getattr(model, "train_function", None)
        if original is None:
            return
        remaining = [self.skip]
        k = self.k
        run = self

        def skip_batches(iterator):
            n = min(k, remaining[0])
            for _ in range(n):
                next(iterator)
            remaining[0] -= n
            if remaining[0] <= 0:
                model.train_function = original
                run.skipping = False
            # The batch-end callbacks still run: give them the usual names (no values yet).
            try:
                return model.get_metrics_result()
            except Exception:
                return {}

        self.skip = 0
        self.skipping = True
        model.train_function = skip_batches


def _first_line(error):
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
