"""Requests from the engine, set by the channel thread and served by the training thread at a
batch boundary: pause, resume, checkpoint, park and stop."""

import threading

from . import protocol


class Parked(BaseException):
    """Ends a Keras 2 fit() at once on park (its BackupAndRestore would count the epoch done)."""


class Stopped(Parked):
    """The same on stop."""


class Control:
    """Engine requests, set by the channel thread and served by the training thread."""

    def __init__(self, send_state):
        self._cond = threading.Condition()
        self._send_state = send_state
        # Read on every batch without the lock: the one cost of the hook on a quiet job.
        self.pending = False
        self.pause = False
        self.checkpoint = False
        self.park = False
        self.stop = False
        self.paused = False
        self.parked = False
        # A park to be relaunched at micro-batches of batch / N: the checkpoint is saved so.
        self.park_accumulation = None
        self._fit_answer = None  # the engine's answer to a --fit-batch forecast
        self._fit_waiting = False

    def ask_fit(self, send, timeout):
        """Send a --fit-batch forecast (``send()``) and wait for the engine's answer: the
        accumulation to train at (0: nothing fits), or None when none came in ``timeout`` s."""
        with self._cond:
            self._fit_answer, self._fit_waiting = None, True
        send()
        with self._cond:
            self._cond.wait_for(lambda: self._fit_answer is not None, timeout)
            answer, self._fit_answer, self._fit_waiting = self._fit_answer, None, False
            return answer

    def fit_answered(self, accumulation):
        """The engine's answer (the channel thread); one that nobody waits for is dropped."""
        with self._cond:
            if self._fit_waiting:
                self._fit_answer = accumulation
                self._cond.notify_all()

    def request(self, kind):
        """Record a command; returns the state to report now (or None)."""
        with self._cond:
            reply = None
            if kind == protocol.PAUSE:
                if self.park or self.stop:
                    return None
                if not self.pause and not self.paused:
                    reply = protocol.STATE_PAUSING
                self.pause = True
            elif kind == protocol.RESUME:
                if self.pause and not self.paused:
                    reply = protocol.STATE_RUNNING  # the pause had not taken hold yet
                self.pause = False
            elif kind == protocol.CHECKPOINT:
                self.checkpoint = True
            elif kind == protocol.PARK:
                if not self.park:
                    reply = protocol.STATE_PARKING
                self.park = True
                self.pause = False
            elif kind == protocol.STOP:
                if not self.stop:
                    reply = protocol.STATE_STOPPING
                self.stop = True
                self.pause = False
            self.pending = True
            self._cond.notify_all()
            return reply

    def serve(self, run):
        """Act on the requests at a batch boundary; blocks while paused."""
        with self._cond:
            while True:
                if self.stop and not run.stopping:
                    self._cond.release()
                    try:
                        run.request_stop()
                    finally:
                        self._cond.acquire()
                if self.park and not self.parked:
                    self.parked = True
                    self._cond.release()
                    try:
                        run.park()
                    finally:
                        self._cond.acquire()
                if self.checkpoint:
                    self.checkpoint = False
                    self._cond.release()
                    try:
                        run.checkpoint_on_request(self.paused)
                    finally:
                        self._cond.acquire()
                    continue
                if self.pause and not (self.parked or self.stop):
                    if not self.paused:
                        self.paused = True
                        epoch, step = run.position
                        self._send_state(protocol.STATE_PAUSED, epoch=epoch + 1, step=step)
                    self._cond.wait()
                    continue
                break
            if self.paused:
                self.paused = False
                self._send_state(protocol.STATE_RUNNING)
            self.pending = self.checkpoint or (self.park and not self.parked)
