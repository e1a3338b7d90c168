"""The one wrapper every NVML call goes through.

NVML is initialised on first use and shut down at exit. A call that fails gives ``None`` (the
"not available" value, "n/a" in the UI, ``null`` in JSON), never an exception and never a
made-up 0; each failing function is logged once. Versioned functions fall back to older
versions when the driver or the bindings lack them.
"""

from __future__ import annotations

import atexit
import logging
import threading
from types import ModuleType
from typing import Any, Dict, Optional, Sequence, Set

log = logging.getLogger("headroom.nvml")

# Error codes of the NVML C API (nvml.h); the module's own constants are used when present.
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
# What NVML writes into a 64-bit field it cannot fill (per-process memory under WDDM or MIG).
NVML_VALUE_NOT_AVAILABLE = 2**64 - 1

# Errors that mean the device behind a handle is gone: the handles must be looked up again.
_LOST = {
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_UNINITIALIZED,
}
# Errors that only say "this GPU or driver does not offer that": worth a note, not a warning.
_QUIET = {NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND}


def error_code(exc: BaseException) -> Optional[int]:
    """The NVML return code carried by an ``NVMLError`` (None for other exceptions)."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def init_failure_message(exc: BaseException) -> str:
    """One line for the user about why NVML could not start."""
    code = error_code(exc)
    if code == NVML_ERROR_LIBRARY_NOT_FOUND:
        return "no NVIDIA GPU found (the NVIDIA driver library is not installed)"
    if code == NVML_ERROR_DRIVER_NOT_LOADED:
        return "no NVIDIA GPU found (the NVIDIA driver is not loaded)"
    if isinstance(exc, ImportError):
        return "no NVIDIA GPU found (nvidia-ml-py is not installed)"
    return f"NVIDIA driver error: {exc}"


class Nvml:
    """Lazy NVML session over a ``pynvml`` module (nvidia-ml-py, or a fake in tests).

    ``call(name, *args)`` runs ``module.name(*args)`` and returns its result, or None when the
    function is missing or raises. ``first(names, *args)`` tries versioned names in order and
    remembers the first one the driver has. ``lost`` turns True when a call says a GPU is gone.
    """

    def __init__(self, module: Optional[ModuleType] = None) -> None:
        self._module = module
        self._lock = threading.Lock()
        self._initialised = False
        self._init_error: Optional[str] = None
        self._tried = False
        self._logged: Set[str] = set()
        self._chosen: Dict[str, str] = {}
        self.lost = False
        self.last_error: Optional[int] = None

    @property
    def module(self) -> Optional[ModuleType]:
        return self._module

    @property
    def init_error(self) -> Optional[str]:
        """Why NVML could not start (one line), or None."""
        self.init()
        return self._init_error

    def init(self) -> bool:
        """Initialise once; True when NVML is usable. A failure is remembered, not retried."""
        if self._tried:
            return self._initialised
        with self._lock:
            if self._tried:
                return self._initialised
            self._tried = True
            try:
                if self._module is None:
                    import pynvml  # on first use: a machine without NVIDIA never loads it

                    self._module = pynvml
                self._module.nvmlInit()
            except Exception as e:  # ImportError, NVMLError, OSError from a broken library
                self._init_error = init_failure_message(e)
                log.info("NVML unavailable: %s", self._init_error)
                return False
            self._initialised = True
            atexit.register(self.shutdown)
            return True

    def shutdown(self) -> None:
        """End the NVML session (safe to call twice, and after a failed init)."""
        with self._lock:
            if not self._initialised:
                return
            self._initialised = False
            try:
                atexit.unregister(self.shutdown)
            except Exception:
                pass
            try:
                assert self._module is not None
                self._module.nvmlShutdown()
            except Exception as e:
                log.debug("nvmlShutdown failed: %s", e)

    def _note(self, name: str, exc: BaseException) -> None:
        code = error_code(exc)
        self.last_error = code
        if code in _LOST:
            self.lost = True
        if name in self._logged:
            return
        self._logged.add(name)
        level = logging.INFO if code in _QUIET else logging.WARNING
        log.log(level, "NVML %s failed: %s (further failures of it are not logged)", name, exc)

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``module.name(*args, **kwargs)``, or None when NVML is unusable, the function is
        missing or it raises (the first failure of each function is logged)."""
        if not self._initialised and not self.init():
            return None
        self.last_error = None
        fn = getattr(self._module, name, None)
        if fn is None:
            if name not in self._logged:
                self._logged.add(name)
                log.info("NVML bindings have no %s", name)
            self.last_error = NVML_ERROR_FUNCTION_NOT_FOUND
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            self._note(name, e)
            return None

    def first(self, names: Sequence[str], *args: Any, **kwargs: Any) -> Any:
        """The result of the first of ``names`` that the driver and bindings have.

        Moves to the next name only when a function is missing (``FUNCTION_NOT_FOUND``, absent
        from the bindings, or the bindings' version-mismatch error); any other failure gives
        None at once. The name that worked is used directly on later calls.
        """
        if not self._initialised and not self.init():
            return None
        key = names[0]
        chosen = self._chosen.get(key)
        if chosen is not None:
            return self.call(chosen, *args, **kwargs)
        mismatch = getattr(self._module, "NVMLLibraryMismatchError", None)
        for name in names:
            fn = getattr(self._module, name, None)
            if fn is None:
                continue
            try:
                result = fn(*args, **kwargs)
            except Exception as e:
                missing = error_code(e) == NVML_ERROR_FUNCTION_NOT_FOUND or (
                    mismatch is not None and isinstance(e, mismatch)
                )
                if missing:
                    log.debug("NVML %s is missing; trying an older version", name)
                    continue
                self._note(name, e)
                return None
            self._chosen[key] = name
            return result
        if key not in self._logged:
            self._logged.add(key)
            log.info("NVML has none of %s", ", ".join(names))
        self.last_error = NVML_ERROR_FUNCTION_NOT_FOUND
        return None

    def constant(self, name: str, default: Any) -> Any:
        """A constant of the bindings (``NVML_TEMPERATURE_GPU``...), or ``default``."""
        return getattr(self._module, name, default)

    def has(self, name: str) -> bool:
        return self._module is not None and hasattr(self._module, name)
