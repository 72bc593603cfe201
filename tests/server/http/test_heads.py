"""app/server/http/heads.py: uvicorn's protocol classes guarded with the settings' limits. On real sockets, both parsers: tests/suites/test_connection_limits.py."""

from __future__ import annotations

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.server.http import heads
from app.settings import Settings


@pytest.mark.parametrize("protocol", [HttpToolsProtocol, H11Protocol], ids=["httptools", "h11"])
def test_guarded_protocols_keep_uvicorns_and_carry_the_limits(protocol: type) -> None:
    settings = Settings(header_timeout_s=2.5, max_connections=7)
    guarded = heads.guarded(protocol, settings)
    assert issubclass(guarded, protocol) and issubclass(guarded, heads.HeadGuard)
    assert (guarded.header_timeout_s, guarded.max_connections) == (2.5, 7)
    assert heads.guarded(guarded, settings) is guarded  # installed twice (a second lifespan): guarded once


def test_install_guards_the_protocol_uvicorn_chose_and_lets_h11_read_heads_up_to_ours() -> None:
    config = Config("app.main:app", http="h11")
    config.load()
    heads.install(config, Settings())
    assert issubclass(config.http_protocol_class, H11Protocol)
    assert issubclass(config.http_protocol_class, heads.HeadGuard)
    assert config.h11_max_incomplete_event_size > heads.MAX_HEAD_BYTES


def test_the_431_answer_is_json_with_its_exact_length() -> None:
    head, _, body = heads.TOO_LARGE.partition(b"\r\n\r\n")
    assert body == b'{"error":"headers: the request head exceeds 65536 bytes"}'
    assert f"content-length: {len(body)}".encode() in head.split(b"\r\n")


def test_install_leaves_a_config_not_loaded_alone() -> None:
    config = Config("app.main:app")
    heads.install(config, Settings())
    assert not hasattr(config, "http_protocol_class")
