"""A second ``headroom`` start for a state folder whose tray runs: ask that tray to open the
window, without loading Qt (the first answer comes in milliseconds, not after the seconds Qt and
the plots take to import). Unix: the tray's local socket is a Unix socket
(``ui.single_instance``); elsewhere the tray's own forwarding (Qt's named pipe) is used."""

from __future__ import annotations

import json
import socket
import sys
import time
from typing import Optional

from trayapp import private
from trayapp.config import Paths

ANSWER_SECONDS = 2.0
MAX_ANSWER_BYTES = 64  # the tray answers "ok\n": more than this is not a tray speaking


def tray_socket(paths: Paths) -> str:
    return str(paths.runtime_dir / "tray.sock")  # as ``ui.single_instance.server_name``


def ask_running_tray(paths: Paths, window: str, timeout_s: float = ANSWER_SECONDS) -> Optional[str]:
    """Ask the running tray to open ``window``. None: no tray listens (start one); "" : it
    opened the window; otherwise one line saying why it could not."""
    if sys.platform == "win32":
        return None
    path = tray_socket(paths)
    try:  # as every engine client: what is not the user's own and closed to others is not asked
        private.check_runtime(paths.data_dir, paths.runtime_dir)
        private.check_file(path, private=False)
    except private.UnsafePath as e:
        return f"refusing to trust the running Headroom's socket: {e}"
    except OSError:
        return None  # no runtime folder or no socket: no tray
    deadline = time.monotonic() + timeout_s
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        try:
            sock.connect(path)
        except socket.timeout:
            raise
        except OSError:
            return None  # no tray, or one that died (the new one takes over its socket)
        sock.sendall(json.dumps({"open": window}).encode() + b"\n")
        answer = b""
        while not answer.endswith(b"\n") and len(answer) <= MAX_ANSWER_BYTES:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout
            sock.settimeout(left)
            chunk = sock.recv(64)
            if not chunk:
                break
            answer += chunk
        if answer.strip() == b"ok":
            return ""
        return "the running Headroom gave no answer it should"
    except socket.timeout:
        return (
            f"Headroom is already running but its tray did not answer within "
            f"{timeout_s:g} s (it may be busy); try again in a moment"
        )
    except OSError as e:
        return f"cannot reach the running Headroom: {e.strerror or e}"
    finally:
        sock.close()
