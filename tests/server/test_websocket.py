"""WebSocket upgrades through the real proxy to the fake upstream's echo socket, both on loopback ports."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import WSCloseCode, WSMsgType
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.config import Settings
from proxy.server import create_app
from proxy.server.logging import ACCESS_LOGGER
from proxy.server.websocket import offered_protocols, offers_deflate, sendable
from proxy.simulator.openai_upstream import OpenAIUpstream, deterministic_bytes
from proxy.simulator.responses_socket import ECHO_PROTOCOL
from tests.server.helpers import MakeProxy, Proxy, raw_request

KEY = "proxy-key-for-sockets"


def echo_url(proxy: Proxy, path: str = "/echo/any/path?x=1") -> str:
    return proxy.url.replace("http://", "ws://") + path


async def closed_upstream(upstream: OpenAIUpstream) -> int | None:
    """The close code of the echo socket, once the upstream saw it close."""
    await asyncio.wait_for(upstream.socket_closed.wait(), 10)
    return upstream.socket_closes[-1]


async def test_text_binary_and_pings_round_trip_on_any_path(upstream: OpenAIUpstream, proxy: Proxy) -> None:
    async with aiohttp.ClientSession() as session, session.ws_connect(echo_url(proxy), autoping=False) as ws:
        await ws.send_str("héllo")
        assert (await ws.receive()).data == "héllo"
        payload = deterministic_bytes(1 << 20)
        await ws.send_bytes(payload)
        answer = await ws.receive()
        assert answer.type is WSMsgType.BINARY
        assert answer.data == payload
        await ws.ping(b"are you there")
        pong = await ws.receive()
        assert (pong.type, pong.data) == (WSMsgType.PONG, b"are you there")
    handshake = upstream.requests[-1]
    assert (handshake.method, handshake.path, handshake.query_string) == ("GET", "/echo/any/path", "x=1")


async def test_the_clients_close_reaches_the_upstream_with_its_code(upstream: OpenAIUpstream, proxy: Proxy) -> None:
    async with aiohttp.ClientSession() as session:
        ws = await session.ws_connect(echo_url(proxy))
        await ws.send_str("one")
        await ws.receive()
        await ws.close(code=4001, message=b"done here")
        assert ws.close_code == 4001
    assert await closed_upstream(upstream) == 4001


async def test_the_upstreams_close_reaches_the_client_with_its_code_and_reason(
    upstream: OpenAIUpstream, proxy: Proxy
) -> None:
    async with aiohttp.ClientSession() as session, session.ws_connect(echo_url(proxy)) as ws:
        await ws.send_str("close 4002 upstream is done")
        closing = await ws.receive()
        assert (closing.type, closing.data, closing.extra) == (WSMsgType.CLOSE, 4002, "upstream is done")
    assert await closed_upstream(upstream) == 4002


async def test_subprotocols_are_negotiated_with_the_upstream(upstream: OpenAIUpstream, proxy: Proxy) -> None:
    headers = {"Authorization": "Bearer sk-client", "X-Custom": "kept"}
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(echo_url(proxy), protocols=("other.v2", ECHO_PROTOCOL), headers=headers) as ws,
    ):
        assert ws.protocol == ECHO_PROTOCOL
        client_key = ws._response.request_info.headers["Sec-WebSocket-Key"]
    seen = upstream.requests[-1].headers
    assert seen["Authorization"] == "Bearer sk-client"
    assert seen["X-Custom"] == "kept"
    assert seen["Sec-WebSocket-Protocol"] == f"other.v2,{ECHO_PROTOCOL}"
    assert seen["Sec-WebSocket-Key"] != client_key  # the upstream's handshake is the proxy's own


async def test_the_proxy_key_is_required_for_the_upgrade(upstream: OpenAIUpstream, make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(upstream.base_url, proxy_keys=[KEY])
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(echo_url(proxy))
        assert refused.value.status == 401
        assert not any(request.path.startswith("/echo/") for request in upstream.requests)
        async with session.ws_connect(echo_url(proxy), headers={"X-Proxy-Key": KEY}) as ws:
            await ws.send_str("in")
            assert (await ws.receive()).data == "in"
    assert "X-Proxy-Key" not in upstream.requests[-1].headers


async def test_an_upstream_that_does_not_upgrade_gets_its_status_relayed(proxy: Proxy) -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(echo_url(proxy, "/v1/no-such-route"))
        assert refused.value.status == 404
        with pytest.raises(aiohttp.WSServerHandshakeError) as not_switched:
            await session.ws_connect(echo_url(proxy, "/v1/models"))
        assert not_switched.value.status == 502


async def test_an_unreachable_upstream_is_a_502(make_proxy: MakeProxy, unused_tcp_port: int) -> None:
    proxy = await make_proxy(f"http://127.0.0.1:{unused_tcp_port}")
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(echo_url(proxy))
    assert refused.value.status == 502


async def test_a_message_over_max_body_bytes_closes_both_sides(upstream: OpenAIUpstream, make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(upstream.base_url, max_body_bytes=4096)
    async with aiohttp.ClientSession() as session, session.ws_connect(echo_url(proxy)) as ws:
        await ws.send_bytes(b"x" * 4096)
        assert len((await ws.receive()).data) == 4096
        await ws.send_bytes(b"x" * 4097)
        closing = await ws.receive()
        assert (closing.type, closing.data) == (WSMsgType.CLOSE, WSCloseCode.MESSAGE_TOO_BIG)
    assert await closed_upstream(upstream) == WSCloseCode.GOING_AWAY


async def test_a_message_from_the_upstream_over_max_body_bytes_closes_both_sides(
    upstream: OpenAIUpstream, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(upstream.base_url, max_body_bytes=4096)
    async with aiohttp.ClientSession() as session, session.ws_connect(echo_url(proxy)) as ws:
        await ws.send_str("send 4097")
        closing = await ws.receive()
        assert (closing.type, closing.data) == (WSMsgType.CLOSE, WSCloseCode.MESSAGE_TOO_BIG)
        assert closing.extra == "the upstream sent a message over max_body_bytes"
    assert await closed_upstream(upstream) == WSCloseCode.MESSAGE_TOO_BIG


async def test_a_malformed_upgrade_is_refused(proxy: Proxy) -> None:
    status, _, body = await raw_request(
        proxy.port, b"GET /echo/x HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade, close\r\n\r\n"
    )
    assert status == 400
    assert b"invalid_websocket_upgrade" in body


async def test_a_silent_socket_is_closed_after_idle_timeout(upstream: OpenAIUpstream, make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(upstream.base_url, idle_timeout=0.3)
    async with aiohttp.ClientSession() as session, session.ws_connect(echo_url(proxy)) as ws:
        closing = await ws.receive()
        assert (closing.type, closing.data) == (WSMsgType.CLOSE, WSCloseCode.GOING_AWAY)
        assert "0.3 seconds" in closing.extra
    assert await closed_upstream(upstream) == WSCloseCode.GOING_AWAY


async def test_open_sockets_are_closed_when_the_proxy_shuts_down(upstream: OpenAIUpstream) -> None:
    server = TestServer(create_app(Settings(upstream=upstream.base_url)), host="127.0.0.1", port=0)
    await server.start_server()
    async with aiohttp.ClientSession() as session, session.ws_connect(f"ws://127.0.0.1:{server.port}/echo/x") as ws:
        await ws.send_str("before")
        await ws.receive()
        closing = asyncio.create_task(server.close())
        message = await ws.receive()
        assert (message.type, message.data, message.extra) == (
            WSMsgType.CLOSE,
            WSCloseCode.GOING_AWAY,
            "the proxy is shutting down",
        )
    await closing
    assert await closed_upstream(upstream) == WSCloseCode.GOING_AWAY


async def test_a_client_that_vanishes_is_closed_for_upstream(upstream: OpenAIUpstream, proxy: Proxy) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(
        b"GET /echo/x HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
    writer.close()
    assert await closed_upstream(upstream) == WSCloseCode.GOING_AWAY


async def test_the_access_line_says_what_the_socket_carried(
    upstream: OpenAIUpstream, proxy: Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with aiohttp.ClientSession() as session, session.ws_connect(echo_url(proxy)) as ws:
        await ws.send_str("secret message text")
        await ws.receive()
    line = await asyncio.wait_for(socket_line(caplog), 10)
    assert (line["method"], line["upstream_status"], line["bytes_in"], line["bytes_out"]) == ("GET", 101, 19, 19)
    assert "secret message text" not in caplog.text


async def socket_line(caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    """The access line of the socket, once written (its handler ends just after the client saw the close)."""
    while True:
        for record in caplog.records:
            fields: dict[str, Any] = getattr(record, "fields", {})
            if record.name == ACCESS_LOGGER and fields.get("status") == 101:
                return fields
        await asyncio.sleep(0.01)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(st.one_of(st.text(max_size=300), st.binary(max_size=300)), min_size=1, max_size=8))
async def test_any_messages_round_trip_unchanged(proxy: Proxy, messages: list[str | bytes]) -> None:
    async with aiohttp.ClientSession() as session, session.ws_connect(echo_url(proxy)) as ws:
        for message in messages:
            if isinstance(message, str):
                await ws.send_str(message)
            else:
                await ws.send_bytes(message)
        for message in messages:
            assert (await ws.receive()).data == message


@given(code=st.integers(0, 6000))
def test_only_codes_an_endpoint_may_send_are_relayed(code: int) -> None:
    relayed = sendable(code)
    allowed = (1000 <= code <= 1003) or (1007 <= code <= 1014) or (3000 <= code <= 4999)
    assert relayed == (code if allowed else 1000)


@given(names=st.lists(st.text(alphabet="abcdefghij.-0123456789", min_size=1, max_size=8), max_size=5))
def test_offered_protocols_keep_the_clients_order(names: list[str]) -> None:
    assert offered_protocols([", ".join(names)]) == names
    assert offered_protocols(names) == names


EXTENSIONS = st.sampled_from(["x-webkit-deflate-frame", "permessage-foo", "client_max_window_bits", "deflate"])


@given(
    others=st.lists(EXTENSIONS, max_size=3),
    offered=st.booleans(),
    params=st.sampled_from(["", "; client_max_window_bits", ";server_no_context_takeover; client_max_window_bits=10"]),
    case=st.sampled_from(["permessage-deflate", "PerMessage-Deflate"]),
    split=st.booleans(),
)
def test_a_deflate_offer_is_found_among_any_extensions(
    others: list[str], offered: bool, params: str, case: str, split: bool
) -> None:
    offers = [*others, f" {case}{params}"] if offered else others
    headers = offers if split else [", ".join(offers)]
    assert offers_deflate(headers) is offered


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    code=st.integers(1000, 1003) | st.integers(1007, 1014) | st.integers(3000, 4999),
    reason=st.text(alphabet="abcdefghij -.", max_size=40),
)
async def test_any_close_code_and_reason_cross_the_proxy_both_ways(
    upstream: OpenAIUpstream, proxy: Proxy, code: int, reason: str
) -> None:
    async with aiohttp.ClientSession() as session, session.ws_connect(echo_url(proxy)) as ws:
        await ws.send_str(f"close {code} {reason}")
        closing = await ws.receive()
        assert (closing.type, closing.data, closing.extra) == (WSMsgType.CLOSE, code, reason)
    upstream.socket_closed.clear()
    async with aiohttp.ClientSession() as session:
        ws = await session.ws_connect(echo_url(proxy))
        await ws.close(code=code, message=reason.encode())
        assert ws.close_code == code
    assert await closed_upstream(upstream) == code
