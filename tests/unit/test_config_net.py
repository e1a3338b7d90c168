"""The exporter's and the Machines window's settings: listen addresses, TLS files, a
Prometheus URL. A bad value is one line naming the key and its default."""

from __future__ import annotations

import pytest

from trayapp import config as cfg
from trayapp.config import ConfigError
from trayapp.config.net import Listen, as_url, parse_listen


@pytest.mark.parametrize("text,expected", [
    ("", None), ("  ", None), ("9835", Listen("127.0.0.1", 9835)),
    (9835, Listen("127.0.0.1", 9835)), (" 9835 ", Listen("127.0.0.1", 9835)),
    ("0.0.0.0:80", Listen("0.0.0.0", 80)), ("[::1]:9835", Listen("::1", 9835)),
    ("localhost:1", Listen("localhost", 1)), ("gpu-box.lab:65535", Listen("gpu-box.lab", 65535)),
])
def test_listen_forms(text: object, expected: object) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("bad", [
    ":80", "0", "65536", "99999999999", "host:", "1:2:3", "[::1]9", "[nope]:80", "a b:80",
    "-x:80", True, 9.5, ["9835"], "127.0.0.1:8\n0", "x" * 300 + ":80",
])
def test_bad_listen_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError):
        parse_listen(bad)


def test_loopback_or_not() -> None:
    assert Listen("127.0.0.1", 1).loopback and Listen("::1", 1).loopback
    assert Listen("localhost", 1).loopback and Listen("127.8.9.1", 1).loopback
    assert not Listen("0.0.0.0", 1).loopback and not Listen("::", 1).loopback
    assert not Listen("192.168.1.2", 1).loopback and not Listen("gpu-box", 1).loopback
    assert str(Listen("::1", 9)) == "[::1]:9" and str(Listen("127.0.0.1", 9)) == "127.0.0.1:9"


@pytest.mark.parametrize("bad", ["ftp://x", "http://", "prometheus:9090", "http://a:99999",
                                 "http://a b", 5])
def test_bad_prometheus_urls(bad: object) -> None:
    with pytest.raises(ConfigError):
        as_url(bad)
    assert as_url(" https://prom.lab/p/ ") == "https://prom.lab/p/" and as_url("") == ""


def test_bad_values_are_one_line_each_with_the_default() -> None:
    c = cfg.from_mapping({"metrics": {"listen": "1:2:3", "tls_cert": 5},
                          "machines": {"prometheus": "ftp://x", "refresh_seconds": 0}})
    assert len(c.problems) == 4, c.problems
    for name in ("metrics.listen", "metrics.tls_cert", "machines.prometheus",
                 "machines.refresh_seconds"):
        assert any(name in p and "using the default" in p for p in c.problems), name
    assert c["metrics.listen"] == "" and c["machines.refresh_seconds"] == 5.0
    assert all("\n" not in p for p in c.problems)


def test_a_number_listens_as_text_and_tls_needs_both_files() -> None:
    c = cfg.from_mapping({"metrics": {"listen": 9835, "tls_key": "/k.pem"}})
    assert c["metrics.listen"] == "9835"
    assert c.problems == ["config: metrics.tls_key is set but metrics.tls_cert is not; the "
                          "metrics exporter stays off until both are"]
    ok = cfg.from_mapping({"metrics": {"tls_key": "/k.pem", "tls_cert": "/c.pem"}})
    assert ok.problems == []
