"""Start Headroom at login: an XDG autostart entry on Linux, the per-user Run key on Windows.

No Qt here, so the settings dialog and the tests call the same functions. Every failure is an
``AutostartError`` with one line for the user.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from trayapp.config import atomic_write

ENTRY_NAME = "headroom"  # headroom.desktop / the Run value "Headroom"
RUN_KEY = r"Software\Microsoft\Windows\CurrentVersion\Run"
RUN_VALUE = "Headroom"


class AutostartError(Exception):
    """Start at login could not be read or changed; the message is one line."""


def launch_command() -> List[str]:
    """The argv that starts the tray as the user would: the frozen executable, or this
    Python with ``-m trayapp`` (``pythonw`` on Windows, so no console window opens)."""
    exe = sys.executable
    if getattr(sys, "frozen", False):
        return [exe]
    if sys.platform == "win32":
        windowless = Path(exe).with_name("pythonw.exe")
        if windowless.exists():
            exe = str(windowless)
    return [exe, "-m", "trayapp"]


# -- Linux: the XDG autostart folder --------------------------------------------------------------

# Characters that make the Desktop Entry spec require an argument to be quoted.
_RESERVED = set(" \t\n\"'\\><~|&;$*?#()`")


def _quote_exec_arg(arg: str) -> str:
    if arg and not (set(arg) & _RESERVED):
        quoted = arg
    else:
        escaped = "".join("\\" + c if c in '"`$\\' else c for c in arg)
        quoted = f'"{escaped}"'
    # The Exec value is itself a string value, where a backslash is written twice, and a
    # literal percent sign is "%%" (field codes start with "%").
    return quoted.replace("\\", "\\\\").replace("%", "%%")


def exec_line(argv: Sequence[str]) -> str:
    """``argv`` as the Exec value of a desktop entry, quoted as the Desktop Entry spec asks."""
    return " ".join(_quote_exec_arg(a) for a in argv)


def desktop_entry(argv: Sequence[str]) -> str:
    """The text of the autostart ``.desktop`` file that runs ``argv``."""
    return "\n".join(
        [
            "[Desktop Entry]",
            "Type=Application",
            "Name=Headroom",
            "Comment=Guards RAM and GPU memory while you train models",
            f"Exec={exec_line(argv)}",
            "Icon=headroom",
            "Terminal=false",
            "Categories=Utility;Monitor;",
            "X-GNOME-Autostart-enabled=true",
            "",
        ]
    )


def autostart_dir() -> Path:
    """``$XDG_CONFIG_HOME/autostart``, or ``~/.config/autostart`` when that is not set."""
    base = os.environ.get("XDG_CONFIG_HOME", "").strip()
    # The spec says a relative XDG_CONFIG_HOME is invalid and must be ignored.
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".config"
    return root / "autostart"


def autostart_file() -> Path:
    return autostart_dir() / f"{ENTRY_NAME}.desktop"


def _linux_enabled() -> bool:
    path = autostart_file()
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return False
    except OSError as e:
        raise AutostartError(f"cannot read {path} ({e.strerror})") from None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        # Desktops switch an entry off with these keys rather than deleting the file.
        if key.strip() in ("Hidden", "X-GNOME-Autostart-enabled"):
            off = "true" if key.strip() == "Hidden" else "false"
            if value.strip().lower() == off:
                return False
    return True


def _linux_enable(argv: Sequence[str]) -> str:
    path = autostart_file()
    try:
        atomic_write(path, desktop_entry(argv))
    except OSError as e:
        raise AutostartError(f"cannot write {path} ({e.strerror or e})") from None
    return str(path)


def _linux_disable() -> bool:
    path = autostart_file()
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as e:
        raise AutostartError(f"cannot remove {path} ({e.strerror})") from None
    return True


# -- Windows: the per-user Run key ----------------------------------------------------------------


def run_value(argv: Sequence[str]) -> str:
    """``argv`` as one command line for the Run key (Windows quoting rules)."""
    return subprocess.list2cmdline(list(argv))


def _win_enabled(value_name: str) -> bool:  # pragma: no cover - Windows only
    if sys.platform != "win32":  # also tells type checkers elsewhere to skip the rest
        raise AutostartError("the Run key exists on Windows only")
    import winreg  # Windows only

    try:
        with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY) as key:
            winreg.QueryValueEx(key, value_name)
        return True
    except FileNotFoundError:
        return False
    except OSError as e:
        raise AutostartError(f"cannot read the Run key ({e.strerror or e})") from None


def _win_enable(argv: Sequence[str], value_name: str) -> str:  # pragma: no cover - Windows
    if sys.platform != "win32":  # also tells type checkers elsewhere to skip the rest
        raise AutostartError("the Run key exists on Windows only")
    import winreg  # Windows only

    try:
        with winreg.CreateKeyEx(winreg.HKEY_CURRENT_USER, RUN_KEY, 0, winreg.KEY_SET_VALUE) as key:
            winreg.SetValueEx(key, value_name, 0, winreg.REG_SZ, run_value(argv))
    except OSError as e:
        raise AutostartError(f"cannot write the Run key ({e.strerror or e})") from None
    return "HKCU\\" + RUN_KEY + "\\" + value_name


def _win_disable(value_name: str) -> bool:  # pragma: no cover - Windows only
    if sys.platform != "win32":  # also tells type checkers elsewhere to skip the rest
        raise AutostartError("the Run key exists on Windows only")
    import winreg  # Windows only

    try:
        with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY, 0, winreg.KEY_SET_VALUE) as key:
            winreg.DeleteValue(key, value_name)
        return True
    except FileNotFoundError:
        return False
    except OSError as e:
        raise AutostartError(f"cannot change the Run key ({e.strerror or e})") from None


# -- the public calls -----------------------------------------------------------------------------


def supported() -> bool:
    """Whether this system has a start-at-login place Headroom knows (Linux, Windows)."""
    return sys.platform == "win32" or sys.platform.startswith("linux")


def _check_supported() -> None:
    if not supported():
        raise AutostartError(f"start at login is not supported on {sys.platform}")


def is_enabled(value_name: str = RUN_VALUE) -> bool:
    """Whether Headroom starts at login. Raises AutostartError when that cannot be read."""
    _check_supported()
    if sys.platform == "win32":  # pragma: no cover - Windows only
        return _win_enabled(value_name)
    return _linux_enabled()


def enable(argv: Optional[Sequence[str]] = None, value_name: str = RUN_VALUE) -> str:
    """Start Headroom (``argv``, default ``launch_command()``) at login; returns where that is
    recorded (a file or a registry value). Raises AutostartError on failure."""
    _check_supported()
    argv = list(argv) if argv is not None else launch_command()
    if sys.platform == "win32":  # pragma: no cover - Windows only
        return _win_enable(argv, value_name)
    return _linux_enable(argv)


def disable(value_name: str = RUN_VALUE) -> bool:
    """Stop starting Headroom at login; returns whether an entry was removed. Raises
    AutostartError on failure."""
    _check_supported()
    if sys.platform == "win32":  # pragma: no cover - Windows only
        return _win_disable(value_name)
    return _linux_disable()


def set_enabled(on: bool, argv: Optional[Sequence[str]] = None) -> None:
    """``enable()`` or ``disable()``. Raises AutostartError on failure."""
    if on:
        enable(argv)
    else:
        disable()
