"""The frozen executable's entry point: the same command line as ``python -m trayapp``."""

import multiprocessing
import os
import sys


def _give_windowed_streams() -> None:
    # A windowed Windows executable starts with no stdout/stderr (None); a print or a logging
    # handler would then raise. Send them to the null device instead.
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))


def _unbundle_library_path() -> None:
    # The bootloader puts the bundle first on LD_LIBRARY_PATH. The dynamic loader read it when
    # this process started, so restoring the user's value changes nothing here; it keeps the
    # bundle's libraries out of the programs started from here (the user's own Python running a
    # job must load its own libstdc++ and friends). Our own executable sets the path again.
    if "LD_LIBRARY_PATH_ORIG" in os.environ:
        os.environ["LD_LIBRARY_PATH"] = os.environ.pop("LD_LIBRARY_PATH_ORIG")
    else:
        os.environ.pop("LD_LIBRARY_PATH", None)


def _command(argv: list) -> "str | None":
    """The sub-command in ``argv`` (None for the tray), skipping the top-level options."""
    args = iter(argv)
    for arg in args:
        if arg in ("--config", "--open"):
            next(args, None)
        elif not arg.startswith("-"):
            return arg
    return None


def _unbundle_dll_directory() -> None:
    # On Windows the bootloader's SetDllDirectory(bundle) is inherited by child processes.
    # Sub-commands (the engine above all, which starts the user's Python for jobs) load no Qt,
    # so they give the default search order back; the tray keeps it for Qt's plugins.
    import ctypes

    ctypes.windll.kernel32.SetDllDirectoryW(None)  # type: ignore[attr-defined]


if __name__ == "__main__":
    multiprocessing.freeze_support()
    _give_windowed_streams()
    if getattr(sys, "frozen", False):
        if sys.platform == "win32":
            if _command(sys.argv[1:]) is not None:
                _unbundle_dll_directory()
        else:
            _unbundle_library_path()
    from trayapp.cli import main

    sys.exit(main())
