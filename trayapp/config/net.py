"""Addresses as settings and flags write them: where the metrics exporter listens
(``"9835"``, ``"127.0.0.1:9835"``, ``"[::1]:9835"``), and a Prometheus server's URL."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, NamedTuple, Optional
from urllib.parse import urlsplit

from trayapp.config.sizes import ConfigError, _shown

LOOPBACK_HOST = "127.0.0.1"  # where a bare port listens
_HOST_NAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9-]{1,63})*$")
TEXT_MAX = 4096  # a path or a URL longer than this is not one


class Listen(NamedTuple):
    """Where to listen: ``host`` (an IP address or a name) and ``port``."""

    host: str
    port: int

    @property
    def loopback(self) -> bool:
        """Whether only this machine can reach it (127.0.0.0/8, ::1, "localhost")."""
        return is_loopback(self.host)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _port(text: str) -> int:
    if not text.isdigit() or len(text) > 5 or not 1 <= int(text) <= 65535:
        raise ConfigError("the port must be a number from 1 to 65535")
    return int(text)


def _host(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    if _HOST_NAME.match(text):
        return text
    raise ConfigError(f"{_shown(text)} is not an IP address or a host name")


def parse_listen(value: Any) -> Optional[Listen]:
    """``"PORT"`` (loopback), ``"ADDR:PORT"`` or ``"[IPv6]:PORT"``; ``""`` is off (None).

    Raises ConfigError, with a one-line reason, for anything else."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ConfigError("it is not a PORT or an ADDRESS:PORT")
    text = str(value).strip()
    if not text:
        return None
    if text.isdigit():
        return Listen(LOOPBACK_HOST, _port(text))
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise ConfigError("an IPv6 address is written [ADDRESS]:PORT")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError(f"{_shown(host)} is not an IPv6 address") from None
        return Listen(str(ipaddress.IPv6Address(host)), _port(port))
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ConfigError("it is not a PORT or an ADDRESS:PORT")
    if ":" in host:
        raise ConfigError("an IPv6 address is written [ADDRESS]:PORT")
    return Listen(_host(host), _port(port))


def as_listen(value: Any) -> str:
    """The check of ``metrics.listen``: the value as written back (a number becomes text)."""
    listen = parse_listen(value)
    return "" if listen is None else str(value).strip()


def as_path_text(value: Any) -> str:
    """The check of a file path setting (``""`` for none)."""
    if not isinstance(value, str):
        raise ConfigError("it is not a file path")
    if "\x00" in value or len(value) > TEXT_MAX:
        raise ConfigError("it is not a file path")
    return value.strip()


def as_url(value: Any) -> str:
    """The check of ``machines.prometheus``: ``""`` or an http(s) URL with a host."""
    if not isinstance(value, str):
        raise ConfigError("it is not a URL")
    text = value.strip()
    if not text:
        return ""
    if len(text) > TEXT_MAX or any(c.isspace() or ord(c) < 32 for c in text):
        raise ConfigError("it is not a URL")
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        raise ConfigError("it is not a URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError("it is not an http:// or https:// URL")
    return text
