"""Client connections: silent, half-sent and idle ones are closed on time, a flood of idle sockets cannot exhaust the
process's file descriptors (the connection cap), and what the proxy logs about them stays one line per event.

The timeouts are tested against the in-process proxy; the cap against the real `compaction-proxy serve` process with
a lowered open-file limit, the way it runs in production (the cap is applied where `serve` listens).
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.reliability.conftest import MakeProxy, chat_body
from tests.support.openai_upstream import OpenAIUpstream, fixed_responder

HEADER_TIMEOUT = 0.5


async def seconds_until_closed(reader: asyncio.StreamReader, within: float = 5.0) -> float:
    """Read (and drop) what the proxy sends until it closes the connection; return how long that took."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(within):
        while await reader.read(65536):
            pass
    return loop.time() - started


@pytest.mark.parametrize(
    "sent",
    [b"", b"GET /v1/mod", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le"],
    ids=["nothing", "half-a-request-line", "half-a-head"],
)
async def test_a_connection_without_a_complete_request_head_is_closed_after_the_header_timeout(
    upstream: OpenAIUpstream, make_proxy: MakeProxy, sent: bytes
) -> None:
    proxy = await make_proxy(upstream.base_url, client_header_timeout=HEADER_TIMEOUT)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        writer.write(sent)
        await writer.drain()
        assert HEADER_TIMEOUT - 0.1 <= await seconds_until_closed(reader) < HEADER_TIMEOUT + 1.5
    finally:
        writer.close()
    assert upstream.requests == []


async def test_an_idle_keep_alive_connection_is_closed_after_the_header_timeout(
    upstream: OpenAIUpstream, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(upstream.base_url, client_header_timeout=HEADER_TIMEOUT)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        for _ in range(3):  # a connection in use stays open across requests
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            length = next(
                int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
        assert HEADER_TIMEOUT - 0.1 <= await seconds_until_closed(reader) < HEADER_TIMEOUT + 1.5
    finally:
        writer.close()


async def test_a_response_longer_than_the_header_timeout_is_not_cut(
    upstream: OpenAIUpstream, make_proxy: MakeProxy, http: aiohttp.ClientSession
) -> None:
    """The timer only closes connections waiting for a request head: never one whose request is in progress."""
    proxy = await make_proxy(upstream.base_url, client_header_timeout=0.3)
    upstream.responder = fixed_responder("one two three four five six seven eight nine ten")
    upstream.stream_chunk_delay = 0.1  # about 1.2 s in all: four header timeouts
    async with http.post(proxy.url + "/v1/chat/completions", data=chat_body(stream=True)) as response:
        assert response.status == 200
        body = await response.read()
    assert body.endswith(b"data: [DONE]\n\n")
    assert upstream.streams_completed == 1
