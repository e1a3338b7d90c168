"""A job's log, capped in place, and output streams a full disk cannot turn into a crash.

The job writes its output straight to ``jobs/<id>/log``, opened with O_APPEND: there is no pipe,
so no reader can go away under it (the engine's death never touches the job), and after a trim
every write lands at the file's new end. The cap keeps the log's head (the first eighth of the
cap: the script's start, TensorFlow's set-up) and its tail (the last half), with one line between
them that says how many bytes were dropped there. Two parties trim: the runner, inside the job's
own writes (so even a job printing as fast as it can stays near its cap, and no write of its
races the trim), and the engine, ten times a second, once a log is further over its cap
than the runner lets it go (what bypasses Python: TensorFlow's C++ logs, child processes), and
once more when the job has ended. An exclusive flock, taken without waiting, keeps two trims
apart; writers never lock. Bytes another process appends in the instant between a trim's last
look and its truncation are lost with the dropped middle.

``guard_output`` replaces ``sys.stdout`` and ``sys.stderr`` with streams whose writes never raise:
a full disk (ENOSPC), a closed pipe (EPIPE) or an I/O error drops the output, warns once, and
says how much was dropped once writing works again. The job goes on and ends with its own exit
status.

Stdlib only, Python >= 3.9: this runs inside the job's interpreter. The engine imports it too,
so there is one definition of the cap and its marker.
"""

import io
import os
import re
import stat
import sys

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

# Windows has no O_APPEND at the OS level for a handle a child inherits: a trim there would
# leave the job writing at its old offset. The cap applies on POSIX systems.
SUPPORTED = os.name == "posix" and fcntl is not None

HEAD_SHARE = 8  # the head kept is the first 1/8 of the cap
TAIL_SHARE = 2  # after a trim, the tail kept is the last 1/2 of the cap
LINE_SEARCH = 64 * 1024  # the kept tail starts at a line if one starts this close
COPY_CHUNK = 8 << 20  # in the kernel (copy_file_range)
BUFFER_CHUNK = 1 << 20  # through a buffer, where the kernel cannot
MARKER_MAX = 400
_MARKER = re.compile(rb"\n\[headroom: ([0-9]{1,20}) bytes of output dropped here[^\n]{0,300}\]\n")


def head_bytes(max_bytes):
    return max(1, int(max_bytes) // HEAD_SHARE)


def tail_bytes(max_bytes):
    return max(1, int(max_bytes) // TAIL_SHARE)


def check_every(max_bytes):
    """How many bytes the runner writes between two looks at the log's size."""
    return max(64 * 1024, int(max_bytes) // 16)


def engine_slack(max_bytes):
    """How far past its cap the engine lets a running job's log go before it trims it: further
    than the runner's own trims let it, so the two do not race over Python's output."""
    return 2 * check_every(max_bytes)


def _size(n):
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.1f} KiB"
    return f"{n} bytes"


def marker(dropped, max_bytes):
    """The line that stands for the dropped middle (it starts with a newline, so a line cut at
    the head's end stays a line of its own)."""
    return (
        f"\n[headroom: {dropped} bytes of output dropped here; the log keeps its first "
        f"{_size(head_bytes(max_bytes))} and its last {_size(tail_bytes(max_bytes))} "
        f"(setting jobs.log_max_mb)]\n"
    ).encode("ascii")


def marker_offset(fd, max_bytes):
    """Where the marker of an earlier trim starts in the open file ``fd``, or None."""
    head = head_bytes(max_bytes)
    try:
        found = _MARKER.match(os.pread(fd, MARKER_MAX, head))
    except OSError:
        return None
    return head if found else None


def _pwrite_all(fd, data, offset):
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _move(fd, src, dst, n):
    """Copy ``n`` bytes of ``fd`` from ``src`` to ``dst`` (< ``src``) in place; returns the
    bytes copied (fewer at an early end of file). In the kernel where it can
    (copy_file_range, in pieces that do not overlap), through a buffer where it cannot."""
    gap = src - dst
    done = 0
    fast = hasattr(os, "copy_file_range")
    while done < n:
        want = min(COPY_CHUNK if fast else BUFFER_CHUNK, n - done, gap)
        if fast:
            try:
                got = os.copy_file_range(fd, fd, want, src + done, dst + done)
            except OSError:
                fast = False
                continue
        else:
            chunk = os.pread(fd, want, src + done)
            _pwrite_all(fd, chunk, dst + done)
            got = len(chunk)
        if got <= 0:
            break
        done += got
    return done


def _trim_locked(fd, size, max_bytes):
    head = head_bytes(max_bytes)
    start, before = head, 0  # the dropped part starts after the head (and an earlier marker)
    found = _MARKER.match(os.pread(fd, MARKER_MAX, head))
    if found:
        start, before = head + found.end(), int(found.group(1))
    tail_from = max(start, size - tail_bytes(max_bytes))
    window = os.pread(fd, LINE_SEARCH, tail_from)
    newline = window.find(b"\n")
    if 0 <= newline < len(window) - 1:
        tail_from += newline + 1
    if tail_from <= start:
        return 0
    mark = marker(before + tail_from - start, max_bytes)
    dst = head + len(mark)
    if dst > tail_from:  # a cap too small to hold its own marker
        return 0
    _pwrite_all(fd, mark, head)
    src = tail_from
    # The job may go on appending while its tail moves forward: copy until the end holds still.
    for _ in range(64):
        end = os.fstat(fd).st_size
        if src >= end:
            break
        want = end - src
        moved = _move(fd, src, dst, want)
        src += moved
        dst += moved
        if moved < want:
            break  # the file got shorter under us
    os.ftruncate(fd, dst)
    return tail_from - start


def trim(path, max_bytes, slack=0):
    """Bring the log at ``path`` back under ``max_bytes`` if it is more than ``slack`` bytes
    over: keep its head and its tail, and a marker line counting every byte dropped so far.
    Returns the bytes dropped by this call (0 when the log is within its cap, or another trim
    holds it now).

    Raises OSError when the file cannot be opened or written; a log that is not a regular file
    is left alone.
    """
    if not SUPPORTED:
        return 0
    fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0  # being trimmed right now
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size <= max_bytes + slack:
            return 0
        return _trim_locked(fd, st.st_size, max_bytes)
    finally:
        os.close(fd)  # and the lock with it


# -- the job's own output ---------------------------------------------------------------------


class _Output:
    """What the job's stdout and stderr share: the log and its cap, and what was dropped."""

    def __init__(self, log_path=None, max_bytes=None, log_id=None):
        self.log_path = log_path
        self.max_bytes = max_bytes
        self.log_id = log_id  # (st_dev, st_ino) of the log, to trim only the file we write
        self.every = check_every(max_bytes) if max_bytes else 0
        self.since_check = 0
        self.dropped = 0  # bytes dropped since the last write that worked
        self.dropped_total = 0
        self.problem = None  # the error of the current drop, in words
        self.warned = False
        self.warning = None  # the warning, kept until someone can take it
        self._on_drop = None

    @property
    def on_drop(self):
        return self._on_drop

    @on_drop.setter
    def on_drop(self, fn):
        """``fn(message)``: called once, the first time output is dropped (at once if it
        already was)."""
        self._on_drop = fn
        if fn is not None and self.warning is not None:
            message, self.warning = self.warning, None
            fn(message)

    def lost(self, n, error):
        self.dropped += n
        self.dropped_total += n
        self.problem = error.strerror or str(error)
        if not self.warned:
            self.warned = True
            where = f" (its log {self.log_path})" if self.log_path else ""
            message = f"the job's output is being dropped: {self.problem}{where}; the job goes on"
            if self._on_drop is None:
                self.warning = message
            else:
                try:
                    self._on_drop(message)
                except Exception:
                    pass

    def wrote(self, fd, n):
        if not self.every:
            return
        self.since_check += n
        if self.since_check < self.every:
            return
        self.since_check = 0
        try:
            st = os.fstat(fd)
            if st.st_size > self.max_bytes and (st.st_dev, st.st_ino) == self.log_id:
                trim(self.log_path, self.max_bytes)
        except OSError:
            pass  # the engine trims too


class SafeWriter(io.RawIOBase):
    """A file descriptor whose writes never raise: what cannot be written is dropped and
    counted (see ``_Output``). Closing it leaves the descriptor open for the rest of the
    process (C code, the interpreter's last words)."""

    def __init__(self, fd, output, name):
        super().__init__()
        self._fd = fd
        self._output = output
        self.name = name
        self.mode = "wb"

    def writable(self):
        return True

    def fileno(self):
        return self._fd

    def isatty(self):
        try:
            return os.isatty(self._fd)
        except OSError:
            return False

    def _write_all(self, data):
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def write(self, b):
        view = memoryview(b).cast("B")
        n = len(view)
        out = self._output
        if out.dropped:
            note = (
                f"[headroom: {out.dropped} bytes of output were dropped here: {out.problem}]\n"
            ).encode()
            try:
                self._write_all(note)
                out.dropped = 0
            except OSError as e:
                out.lost(n, e)
                return n
        done = 0
        try:
            done = os.write(self._fd, view)
            while done < n:
                done += os.write(self._fd, view[done:])
        except OSError as e:
            out.lost(n - done, e)
            return n
        if out.every:
            out.wrote(self._fd, n)
        return n

    def close(self):
        # Mark closed without closing the descriptor.
        io.RawIOBase.close(self)


def _safe_stream(stream, fd, output, name):
    """A text stream over ``fd`` like ``stream`` (encoding, errors, buffering), writing through
    a SafeWriter."""
    raw = SafeWriter(fd, output, name)
    unbuffered = bool(getattr(stream, "write_through", False)) and isinstance(
        getattr(stream, "buffer", None), io.FileIO
    )
    binary = raw if unbuffered else io.BufferedWriter(raw)
    return io.TextIOWrapper(
        binary,
        encoding=getattr(stream, "encoding", None) or "utf-8",
        errors=getattr(stream, "errors", None) or "strict",
        line_buffering=bool(getattr(stream, "line_buffering", False)),
        write_through=unbuffered,
    )


def guard_output(log_path=None, max_bytes=None):
    """Replace ``sys.stdout`` and ``sys.stderr`` (when they are the process's file descriptors 1
    and 2) with streams that never raise on write and that keep the log at ``log_path`` under
    ``max_bytes`` when they write to it. Returns the shared ``_Output``, whose ``on_drop`` takes
    the one warning."""
    log_id = None
    if log_path and max_bytes and SUPPORTED:
        try:
            st = os.stat(log_path)
            log_id = (st.st_dev, st.st_ino)
        except OSError:
            log_path = None
    else:
        log_path, max_bytes = None, None
    output = _Output(log_path, int(max_bytes) if max_bytes else None, log_id)
    for attr, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, attr, None)
        try:
            if stream is None or stream.fileno() != fd:
                continue
            stream.flush()
        except (OSError, ValueError, AttributeError):
            continue
        setattr(sys, attr, _safe_stream(stream, fd, output, f"<{attr}>"))
    return output
