"""The ``keras.Model.fit`` patch and the callbacks it adds, built from the Keras the script
imported (the runner cannot import Keras itself: the script chooses which one)."""

import functools
import inspect
import os
import sys
import tempfile

from . import fitbatch, metricstate, progbar, protocol, relaunch, shrink
from .checkpoint import saved_history as _saved_history
from .control import Parked
from .layout import WEIGHTS_FILE
from .training import FitRun, _first_line, _int


def _callback_classes(callbacks_module, keras3):
    """(the progress callback, the first callback, the restoring callback or None, the
    progress bar class or None)."""
    headroom_cls, first_cls = _progress_classes(callbacks_module.Callback)
    return (
        headroom_cls,
        first_cls,
        _restore_class(callbacks_module, keras3),
        progbar.bar_class(callbacks_module) if keras3 else None,
    )


def _progress_classes(base):
    class HeadroomCallback(base):
        # Keras 3 runs batch-end callbacks on a thread when all are "async safe"; ours only
        # queues progress there, so it keeps the user's fit as fast as without it.
        async_safe = True

        def __init__(self, run):
            super().__init__()
            self._run = run
            # Called on every batch: the run's own methods, one call each.
            self.on_train_batch_begin = run.batch_begin
            self.on_train_batch_end = run.batch_end

        def on_train_begin(self, logs=None):
            self._run.train_begin(self.params or {})

        def on_epoch_begin(self, epoch, logs=None):
            self._run.epoch_begin(epoch)

        def on_test_batch_begin(self, batch, logs=None):
            self._run.test_batch_begin()

        def on_epoch_end(self, epoch, logs=None):
            self._run.epoch_end(epoch, logs)

        def on_train_end(self, logs=None):
            self._run.train_end(logs)

    class FirstCallback(base):
        """Runs before the user's callbacks: sees whether fit() stopped inside the epoch."""

        async_safe = True

        def __init__(self, run):
            super().__init__()
            self._run = run

        def on_epoch_begin(self, epoch, logs=None):
            self._run.stop_seen = False

        def on_train_batch_begin(self, batch, logs=None):
            run = self._run
            if not run.skipping:
                run.begun = batch

        def on_train_batch_end(self, batch, logs=None):
            pass  # Keras's own would call the on_batch_end alias on every batch

        def on_epoch_end(self, epoch, logs=None):
            self._run.stop_seen = bool(getattr(self.model, "stop_training", False))

    return HeadroomCallback, FirstCallback


def _restore_class(callbacks_module, keras3):
    backup_base = getattr(callbacks_module, "BackupAndRestore", None)
    if keras3 and backup_base is not None:

        class Restore(backup_base):
            """BackupAndRestore for restoring only; the HeadroomCallback does the saving."""

            async_safe = True

            def __init__(self, run):
                super().__init__(backup_dir=run.dir, save_freq="epoch", delete_checkpoint=False)
                self._run = run

            def on_train_begin(self, logs=None):
                folder = self._run.dir
                if not os.path.exists(os.path.join(folder, WEIGHTS_FILE)):
                    return
                if not self.model.built:
                    self._run.session.note(
                        protocol.NOTE_WARN,
                        "cannot restore the checkpoint: the model is not built before fit() "
                        "(give it an Input layer or call model.build())",
                    )
                    return
                try:
                    super().on_train_begin(logs)
                except Exception as e:
                    raise RuntimeError(
                        f"cannot restore the checkpoint in {folder}: {_first_line(e)}"
                    ) from e

            def on_epoch_end(self, epoch, logs=None):
                pass

            def on_train_batch_begin(self, batch, logs=None):
                pass  # restores only: nothing to do on a batch

            def on_train_batch_end(self, batch, logs=None):
                pass

            def on_train_end(self, logs=None):
                pass

        return Restore
    return backup_base


def install(keras, session):
    """Patch ``keras.Model.fit`` of the given Keras package; returns True when hooked."""
    model_class = getattr(keras, "Model", None)
    callbacks_module = getattr(keras, "callbacks", None)
    if model_class is None or callbacks_module is None:
        return False
    original = model_class.fit
    if getattr(original, "__headroom_fit__", False):
        return True
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):
        return False
    if "callbacks" not in signature.parameters:
        return False
    keras3, tf_backend = _keras_facts(keras)
    epochs_default = signature.parameters.get("epochs")
    epochs_default = epochs_default.default if epochs_default is not None else 1
    classes = _callback_classes(callbacks_module, keras3)

    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        if session.active_run is not None:
            return original(self, *args, **kwargs)  # a fit() inside a fit(): leave it alone
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return original(self, *args, **kwargs)  # let Keras say what is wrong
        user = bound.arguments.get("callbacks")
        if user is not None and not isinstance(user, (list, tuple)):
            session.note(
                protocol.NOTE_WARN, "fit(callbacks=...) is not a list: progress is not available"
            )
            return original(self, *args, **kwargs)
        epochs = bound.arguments.get("epochs", epochs_default)
        run, shrinker = _prepare(keras, session, self, bound, epochs, keras3, tf_backend)
        set_callbacks = _callback_setter(bound, run, user, classes, keras3)
        set_callbacks(True)
        if hasattr(self, "_initial_epoch"):
            # Set by a BackupAndRestore of an earlier fit() of this model; only this fit's own
            # checkpoint may choose where it starts.
            self._initial_epoch = None
        session.fit_started(run)
        try:
            history = _fit_shrinking(original, bound, run, shrinker, set_callbacks)
        except Parked:
            history = None
        finally:
            shrinker.done()
            session.fit_ended(run)
        _after_fit(session)
        return history

    fit.__headroom_fit__ = True  # type: ignore[attr-defined]
    model_class.fit = fit
    return True


def _prepare(keras, session, model, bound, epochs, keras3, tf_backend):
    """The run of one hooked fit() and what shrinks it, set up as training is about to start:
    its checkpoint folder, a micro-batch it resumes at, --fit-batch's choice."""
    run = FitRun(
        session,
        model,
        session.next_fit_index(),
        epochs,
        keras3,
        tf_backend,
        bound.arguments.get("initial_epoch", 0),
    )
    folder = getattr(session, "fit_folder", None)
    if folder is not None:  # a kernel: a fit's checkpoint is found by what the fit is
        run.dir = folder(model, bound.arguments)
    run.prepare_folder()
    shrinker = shrink.Shrinker(keras, session, model, bound, keras3)
    run.shrinker = shrinker
    run.keeper = _keeper(model, shrinker, tf_backend)
    shrinker.prepare(tf_backend)
    _resume_shrunk(run, shrinker)
    if session.options["fit_batch"] and run.accumulation == 1:
        if _resuming(run):
            # Accumulators added now would not be in the checkpoint's optimizer state, and
            # Keras would restore none of it.
            session.note(
                protocol.NOTE_INFO,
                "--fit-batch: resumed from a checkpoint: trained at the "
                "micro-batch it was saved with",
            )
        else:
            fitbatch.fit_batch(run, shrinker)
    _say_batch(run, shrinker)
    return run, shrinker


def _keeper(model, shrinker, tf_backend):
    """The copy of the metrics' state as each update ends (``metricstate.Keeper``), for an
    epoch trained again after an out-of-memory error; installed before the shrinker's own train
    step, and kept on the model for its next fit() (installing it traces the step again)."""
    tf = sys.modules.get("tensorflow")
    if not tf_backend or tf is None or shrinker.refusal() is not None:
        return None
    keeper = vars(model).get("_headroom_keeper")
    if keeper is not None and keeper.current():
        return keeper
    if keeper is not None:
        keeper.uninstall()
    keeper = metricstate.Keeper(tf, model)
    keeper = keeper if keeper.install(shrinker) else None
    object.__setattr__(model, "_headroom_keeper", keeper)  # not a layer's tracked state
    return keeper


def _callback_setter(bound, run, user, classes, keras3):
    """``set_callbacks(restore)``: the fit's callbacks, ours around the user's (the restoring
    one first, only when ``restore``: not after an out-of-memory error, whose weights in
    memory are newer than any checkpoint)."""
    headroom_cls, first_cls, restore_cls, bar_cls = classes
    # Keras's bar, counting the user's batches (runner.progbar), where Keras would add its own.
    bar = bar_cls is not None and progbar.wanted(bound, user)

    def set_callbacks(restore):
        first = [first_cls(run)]
        if restore and run.dir and restore_cls is not None:
            first.insert(0, _restorer(restore_cls, run, keras3))
        last = [headroom_cls(run)] + ([bar_cls(run)] if bar else [])
        bound.arguments["callbacks"] = first + list(user or []) + last

    return set_callbacks


def _keras_facts(keras):
    """(Keras 3, the TensorFlow backend) of the Keras package the script imported."""
    version = str(getattr(keras, "__version__", "0"))
    keras3 = _int(version.split(".")[0], 0) >= 3
    tf_backend = True
    if keras3:
        try:
            tf_backend = keras.backend.backend() == "tensorflow"
        except Exception:
            tf_backend = False
    return keras3, tf_backend


def _restorer(restore_cls, run, keras3):
    if keras3:
        return restore_cls(run)
    save_freq = run.every or "epoch"
    return restore_cls(backup_dir=run.dir, save_freq=save_freq, delete_checkpoint=False)


def _after_fit(session):
    if session.control.park:
        # A park that came as fit() was ending: the fit is done and saved, so the job can
        # end here as well as at a batch.
        session.control.parked = True
        session.exit_parked()
    if session.control.stop:
        # Stopped (at a batch, or as fit() was ending): the rest of the script does not run.
        session.exit_stopped()


def _resume_shrunk(run, shrinker):
    """A job resumed from a checkpoint saved at a shrunk batch goes on with it, and a job
    started smaller (``accumulation`` > 1) starts so: the accumulation is set before the
    checkpoint is restored (its optimizer state has the accumulators)."""
    options = run.session.options
    k = options["accumulation"]
    saved = 1
    if run.dir and options["resume"]:
        metadata = run.read_metadata() or {}
        extra = metadata.get("headroom") if isinstance(metadata.get("headroom"), dict) else {}
        saved = _int(extra.get("accumulation"), 1)
        k = max(k, saved)
    if shrinker.inherited:
        k = max(k, shrinker.k)  # an earlier fit of this process shrank: so does this one
    relaunched = options.get("relaunch") or {}
    if relaunched.get("fit") == run.index:
        k = relaunched["accumulation"]
    if k <= 1:
        return
    refusal = shrinker.refusal()
    if refusal is not None:
        run.session.note(
            protocol.NOTE_WARN,
            f"asked to train micro-batches ({k} to an update), but "
            f"{refusal}: trained at the full batch",
        )
        _full_batch(shrinker)
        return
    batch = shrinker.effective_batch()
    if batch % k:
        run.session.note(
            protocol.NOTE_WARN,
            f"batch {batch} does not split into {k} micro-batches: trained at the full batch",
        )
        _full_batch(shrinker)
        return
    if k != saved and _resuming(run):
        _convert_checkpoint(run, shrinker, saved, k)
    micro = shrinker.apply(k)
    run.accumulation = k
    run.batch = (batch, micro)
    how = "resumed" if options["resume"] else "started"
    run.session.note(
        protocol.NOTE_INFO,
        f"{how} at micro-batches of {micro} x {k} (batch {batch}, the same training)",
    )


def _full_batch(shrinker):
    """No accumulation left over from an earlier fit that shrank: this one trains its batch."""
    if shrinker.inherited:
        try:
            shrinker.switch(1)
        except Exception:  # Keras 2 never accumulated
            pass
        shrinker.inherited = False


def _convert_checkpoint(run, shrinker, saved, k):
    """The fit's checkpoint, saved at ``saved`` micro-batches an update, saved again at ``k``
    (a job relaunched smaller after an out-of-memory error): restored into an optimizer set up
    as it was saved, switched at the update boundary, the batches done counted in the new
    micro-batches. Keras restores a checkpoint only into an optimizer with the same variables."""
    model = run.model
    if not getattr(model, "built", False):
        return  # the restore says why it cannot
    metadata = run.read_metadata() or {}
    extra = metadata.get("headroom") if isinstance(metadata.get("headroom"), dict) else {}
    try:
        shrinker.switch(saved)
        model.load_weights(os.path.join(run.dir, WEIGHTS_FILE))
        shrink.to_update_boundary(model.optimizer)
        shrinker.switch(k)
    except Exception as e:
        raise RuntimeError(f"cannot restore the checkpoint in {run.dir}: {_first_line(e)}") from e
    run.accumulation = k
    updates = _int(extra.get("batches_done"), 0) // max(1, saved)
    run.epochs_done = _saved_history(metadata)
    whole = updates * max(1, saved) == _int(extra.get("batches_done"), 0)  # no update half done
    kept = extra.get("metrics") if whole else None
    run.save(
        _int(metadata.get("epoch"), 0),
        updates * k,
        protocol.SAVED_RELAUNCH,
        finished=bool(extra.get("finished")),
        metrics=kept if isinstance(kept, dict) else {},
    )


def _resuming(run):
    return bool(
        run.dir
        and run.session.options["resume"]
        and os.path.exists(os.path.join(run.dir, WEIGHTS_FILE))
    )


def _say_batch(run, shrinker):
    """What the engine needs to shrink the job later: its batch, and whether it can."""
    run.shrinkable = shrinker.refusal() is None
    if run.batch is None and run.shrinkable:
        batch = shrinker.effective_batch(read=False)
        if batch:
            run.batch = (batch, shrink.micro_batch(batch, shrinker.k))


def _fit_shrinking(original, bound, run, shrinker, set_callbacks):
    """``fit()``, trained again at half the micro-batch (twice the accumulation) after an
    out-of-memory error, from where it stood, as often as the floor allows: in this process
    where TensorFlow can be trusted to go on, else in a fresh one (``_relaunch_smaller``)."""
    session = run.session
    while True:
        try:
            # The History has the epochs of the attempts before (and of the checkpoint).
            return original(*bound.args, **bound.kwargs)
        except Exception as error:
            if not shrink.is_oom(error) or run.stopping:
                raise
            refusal = shrinker.refusal()
            plain = refusal is not None and shrinker.plain_ok()
            if refusal is not None and not plain:
                session.note(protocol.NOTE_ERROR, f"out of memory in fit(); not shrunk: {refusal}")
                raise
            halved = shrinker.halve_plain() if plain else shrinker.halve()
            what = shrink.oom_text(error)
            site = shrink.oom_site(error, getattr(run.model, "optimizer", None))
            trusted = shrinker.trusted(site)
            fresh = _fresh_process(site, trusted)
            if halved is None:
                _below_floor(run, shrinker, what, plain, trusted)
                raise
            if fresh is not None:
                cannot = (
                    "Keras 2 trains a smaller batch in place only" if plain else relaunch.possible()
                )
                if cannot is not None:
                    session.note(
                        protocol.NOTE_ERROR,
                        f"out of memory in fit() ({what}); not shrunk: {fresh}, and {cannot}",
                    )
                    raise
            failed = error.with_traceback(None)  # raised again if the relaunch cannot be
        # Out of the except block, the failed step's frames (and their tensors) are gone.
        shrink.release_memory()
        epoch, done = run.updates_done()
        if fresh is not None:
            _relaunch_smaller(run, shrinker, halved, trusted, epoch, done, what, fresh)
            raise failed
        del failed
        if plain:
            _smaller_batch(run, shrinker, bound, set_callbacks, halved, epoch, done, what)
            continue
        micro, k = halved
        shrinker.apply(k)
        run.restart_in_memory(epoch, done, k)
        run.batch = (shrinker.effective_batch(), micro)
        set_callbacks(False)  # the weights in memory are newer than any checkpoint
        bound.arguments["initial_epoch"] = epoch
        session.note(
            protocol.NOTE_WARN,
            f"out of memory at epoch {epoch + 1}, batch {done + 1} ({what}): "
            f"training micro-batches of {micro} x {k} "
            f"(batch {shrinker.effective_batch()}, the same training)",
            topic=protocol.TOPIC_SHRUNK,
        )


def _smaller_batch(run, shrinker, bound, set_callbacks, batch, epoch, done, what):
    """Keras 2 with --on-oom smaller-batch: train on at half the batch, no accumulation."""
    old = shrinker.plain_batch or shrinker.effective_batch()
    ratio = shrinker.apply_plain(batch)
    run.restart_in_memory(epoch, done * ratio, 1)
    run.batch = None
    set_callbacks(False)  # the weights in memory are newer than any checkpoint
    bound.arguments["initial_epoch"] = epoch
    run.session.note(
        protocol.NOTE_WARN,
        f"out of memory at epoch {epoch + 1}, batch {done + 1} ({what}): "
        f"training batches of {batch} instead of {old}; Keras 2 has no "
        "gradient accumulation, so this changes the training "
        "(--on-oom smaller-batch)",
        topic=protocol.TOPIC_SHRUNK,
    )


def _fresh_process(site, trusted):
    """Why training cannot go on in this process after the out-of-memory error at ``site``
    (``shrink.OomSite``), or None (a GPU's memory, or an error raised by Python code)."""
    if not trusted:
        if site.in_update:
            return (
                "the failed step may have changed the optimizer's state (the error was "
                "in its update)"
            )
        return (
            "the failed step may have updated some layers (their gradients were applied "
            "as they came)"
        )
    if site.device == shrink.HOST:
        return (
            "an allocation failed on the host, where TensorFlow may not survive another "
            "in this process"
        )
    return None


def _relaunch_smaller(run, shrinker, halved, trusted, epoch, done, what, why):
    """Relaunch the job in a fresh process (``runner.relaunch``), resuming this fit at the
    halved micro-batch: from a checkpoint of where training is when the weights can be trusted
    (in the job's checkpoint folder, else in a private one), else from its last checkpoint, or
    from the start. Returns only when the relaunch could not be made."""
    session = run.session
    micro, k = halved
    batch = shrinker.effective_batch()
    options = dict(session.options)
    earlier = options.get("relaunch") or {}
    folder = options["checkpoint_dir"]
    temporary = bool(folder and earlier.get("temporary"))
    untrained = (epoch, done) == (run.initial_epoch, 0) and not run.epochs_done
    if folder is None and trusted and not untrained:
        try:
            folder, temporary = tempfile.mkdtemp(prefix="headroom-relaunch-"), True
        except OSError:
            folder = None
    if folder is not None and run.dir is None:
        run.dir = os.path.join(folder, f"fit-{run.index}")
    saved = (
        trusted
        and not untrained
        and run.dir is not None
        and run.save(epoch, done * shrinker.k, protocol.SAVED_OOM, metrics=run.kept_metrics() or {})
    )
    if saved:
        where = f"where it stood (epoch {epoch + 1}, batch {done + 1})"
    elif run.dir and os.path.exists(os.path.join(run.dir, WEIGHTS_FILE)):
        where = "its last checkpoint"
    else:
        where = "its start"
    options.update(
        resume=True,
        checkpoint_dir=folder,
        relaunch={"fit": run.index, "accumulation": k, "temporary": temporary},
    )
    session.note(
        protocol.NOTE_WARN,
        f"out of memory at epoch {epoch + 1}, batch {done + 1} ({what}): "
        f"{why}: relaunched in a fresh process from {where}, training "
        f"micro-batches of {micro} x {k} (batch {batch}, the same training)",
        topic=protocol.TOPIC_SHRUNK,
    )
    failure = relaunch.relaunch(session, options)
    session.note(protocol.NOTE_ERROR, f"the relaunch failed: {failure}")


def _below_floor(run, shrinker, what, plain=False, trusted=True):
    """No smaller micro-batch: with a checkpoint folder, save where training is and park (when
    the weights cannot be trusted, the last checkpoint stays as it is)."""
    floor = (
        f"micro-batch {shrink.micro_batch(shrinker.effective_batch(), shrinker.k)}, "
        f"--min-batch {shrinker.floor}"
    )
    session = run.session
    if plain:
        floor = (
            f"batch {shrinker.plain_batch or shrinker.effective_batch()}, --min-batch "
            f"{shrinker.floor}"
        )
    if not run.dir or plain:
        session.note(
            protocol.NOTE_ERROR, f"out of memory in fit() at the smallest batch ({floor}): {what}"
        )
        return
    if not trusted:
        if os.path.exists(os.path.join(run.dir, WEIGHTS_FILE)):
            session.note(
                protocol.NOTE_ERROR,
                f"out of memory in fit() at the smallest batch ({floor}), "
                "in a step that may have changed the weights: parked with "
                "its last checkpoint: resume it when memory is free",
            )
            session.control.parked = True
            session.exit_parked()
        session.note(
            protocol.NOTE_ERROR, f"out of memory in fit() at the smallest batch ({floor}): {what}"
        )
        return
    epoch, done = run.updates_done()
    run.accumulation = shrinker.k
    if run.save(epoch, done * shrinker.k, protocol.SAVED_OOM):
        session.note(
            protocol.NOTE_ERROR,
            f"out of memory in fit() at the smallest batch ({floor}); "
            "parked with a checkpoint: resume it when memory is free",
        )
        session.control.parked = True
        session.exit_parked()
