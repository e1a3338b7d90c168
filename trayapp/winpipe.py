"""Windows: a named-pipe listener that only the current user can open.

Named pipes made by ``multiprocessing`` get the default security descriptor, which lets other
users read them. This listener gives each pipe instance a DACL with one entry, full access for
the user running the engine (``D:P(A;;GA;;;<user SID>)``). The channel's HMAC key still guards
the conversation; this keeps other users from even connecting.
"""

from __future__ import annotations

import sys
from typing import Any

if sys.platform == "win32":  # pragma: no cover - Windows only
    import _winapi
    import ctypes
    from ctypes import wintypes
    from multiprocessing.connection import BUFSIZE, PipeListener  # type: ignore[attr-defined]

    class _SecurityAttributes(ctypes.Structure):
        _fields_ = [
            ("nLength", wintypes.DWORD),
            ("lpSecurityDescriptor", ctypes.c_void_p),
            ("bInheritHandle", wintypes.BOOL),
        ]

    def _user_sid() -> str:
        """The current user's SID as a string ("S-1-5-21-...")."""
        advapi32 = ctypes.WinDLL("advapi32", use_last_error=True)
        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
        kernel32.GetCurrentProcess.restype = wintypes.HANDLE
        advapi32.OpenProcessToken.argtypes = [
            wintypes.HANDLE,
            wintypes.DWORD,
            ctypes.POINTER(wintypes.HANDLE),
        ]
        advapi32.GetTokenInformation.argtypes = [
            wintypes.HANDLE,
            ctypes.c_int,
            ctypes.c_void_p,
            wintypes.DWORD,
            ctypes.POINTER(wintypes.DWORD),
        ]
        advapi32.ConvertSidToStringSidW.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(wintypes.LPWSTR),
        ]
        kernel32.LocalFree.argtypes = [ctypes.c_void_p]
        kernel32.CloseHandle.argtypes = [wintypes.HANDLE]
        token = wintypes.HANDLE()
        if not advapi32.OpenProcessToken(
            kernel32.GetCurrentProcess(),
            0x0008,  # TOKEN_QUERY
            ctypes.byref(token),
        ):
            raise ctypes.WinError(ctypes.get_last_error())
        try:
            size = wintypes.DWORD()
            advapi32.GetTokenInformation(token, 1, None, 0, ctypes.byref(size))  # TokenUser
            buf = ctypes.create_string_buffer(size.value)
            if not advapi32.GetTokenInformation(token, 1, buf, size, ctypes.byref(size)):
                raise ctypes.WinError(ctypes.get_last_error())
        finally:
            kernel32.CloseHandle(token)
        # TOKEN_USER starts with SID_AND_ATTRIBUTES, whose first field is the SID pointer.
        psid = ctypes.cast(buf, ctypes.POINTER(ctypes.c_void_p))[0]
        text = wintypes.LPWSTR()
        if not advapi32.ConvertSidToStringSidW(psid, ctypes.byref(text)):
            raise ctypes.WinError(ctypes.get_last_error())
        try:
            return str(text.value)
        finally:
            kernel32.LocalFree(text)

    def user_only_attributes() -> Any:
        """SECURITY_ATTRIBUTES granting access to the current user alone (kept alive by the
        caller for as long as pipes are made with it)."""
        advapi32 = ctypes.WinDLL("advapi32", use_last_error=True)
        advapi32.ConvertStringSecurityDescriptorToSecurityDescriptorW.argtypes = [
            wintypes.LPCWSTR,
            wintypes.DWORD,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(wintypes.DWORD),
        ]
        descriptor = ctypes.c_void_p()
        sddl_revision_1 = 1
        if not advapi32.ConvertStringSecurityDescriptorToSecurityDescriptorW(
            f"D:P(A;;GA;;;{_user_sid()})", sddl_revision_1, ctypes.byref(descriptor), None
        ):
            raise ctypes.WinError(ctypes.get_last_error())
        return _SecurityAttributes(ctypes.sizeof(_SecurityAttributes), descriptor, False)

    class UserOnlyPipeListener(PipeListener):
        """``multiprocessing``'s pipe listener, with every pipe instance private to the user.
        ``accept()`` returns an unauthenticated PipeConnection."""

        def __init__(self, address: str):
            self._attributes = user_only_attributes()
            super().__init__(address)

        def _new_handle(self, first: bool = False) -> Any:
            flags = _winapi.PIPE_ACCESS_DUPLEX | _winapi.FILE_FLAG_OVERLAPPED
            if first:
                flags |= _winapi.FILE_FLAG_FIRST_PIPE_INSTANCE
            return _winapi.CreateNamedPipe(
                self._address,
                flags,
                _winapi.PIPE_TYPE_MESSAGE | _winapi.PIPE_READMODE_MESSAGE | _winapi.PIPE_WAIT,
                _winapi.PIPE_UNLIMITED_INSTANCES,
                BUFSIZE,
                BUFSIZE,
                _winapi.NMPWAIT_WAIT_FOREVER,
                ctypes.addressof(self._attributes),
            )
