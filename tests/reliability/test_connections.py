"""Client connections: silent, half-sent and idle ones are closed on time, a flood of idle sockets cannot exhaust the
process's file descriptors (the connection cap), and what the proxy logs about them stays one line per event.

The timeouts are tested against the in-process proxy; the cap against the real `compaction-proxy serve` process with
a lowered open-file limit, the way it runs in production (the cap is applied where `serve` listens).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from proxy.simulator.openai_upstream import OpenAIUpstream, fixed_responder
from tests.reliability.conftest import MakeProxy, chat_body
from tests.support import process_proxy

start_process_proxy = process_proxy.start_process_proxy

HEADER_TIMEOUT = 0.5
NOFILE = 256
"""The proxy process's open-file limit in the cap tests: a derived cap of (256 - 192) // 2 = 32 connections."""
FLOOD = 300
"""Idle sockets opened against it: beyond both the cap and the file limit."""


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


@contextlib.asynccontextmanager
async def idle_sockets(port: int, count: int) -> AsyncIterator[list[asyncio.StreamWriter]]:
    """`count` connections to `port` that never send anything (some the proxy will close); all closed on exit."""
    writers: list[asyncio.StreamWriter] = []
    try:
        for _ in range(count):
            writers.append((await asyncio.open_connection("127.0.0.1", port))[1])
        yield writers
    finally:
        for writer in writers:
            writer.close()


async def timed_health_check(url: str) -> float:
    """GET /healthz on a new connection; return how long the answer took (asserting it is a 200)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with aiohttp.ClientSession() as session, session.get(url + "/healthz") as response:
        assert response.status == 200
    return loop.time() - started


async def test_an_idle_socket_flood_beyond_the_file_limit_leaves_health_checks_and_streams_working(
    upstream: OpenAIUpstream, start_process_proxy: process_proxy.StartProcessProxy
) -> None:
    proxy = await start_process_proxy(upstream.base_url, nofile=NOFILE)
    listening = await proxy.wait_for_log(lambda record: record.get("message") == "listening")
    assert listening["max_connections"] == (NOFILE - 192) // 2
    upstream.responder = fixed_responder("one two three four five six seven eight nine ten")
    upstream.stream_chunk_delay = 0.2  # a stream in progress through the flood: about 2.4 s
    async with aiohttp.ClientSession() as http:
        streaming = await http.post(proxy.url + "/v1/chat/completions", data=chat_body(stream=True))
        assert streaming.status == 200
        async with idle_sockets(proxy.port, FLOOD):
            for _ in range(5):
                assert await asyncio.wait_for(timed_health_check(proxy.url), timeout=5) < 1.0
            # The busy connection was never the one closed to make room.
            assert (await streaming.read()).endswith(b"data: [DONE]\n\n")
        cleared = await proxy.wait_for_log(lambda record: record.get("message") == "connection cap cleared")
    assert cleared["level"] == "info"
    assert cleared["closed_idle"] >= FLOOD - 2 * listening["max_connections"]
    records = proxy.records()
    reached = [record for record in records if record["message"].startswith("connection cap reached")]
    assert [record["level"] for record in reached] == ["warning"]
    assert not [record for record in records if record["level"] in ("error", "critical")]
    assert proxy.logged_bytes < 64 * 1024
    assert await timed_health_check(proxy.url) < 1.0


async def test_the_cap_can_be_set_and_refuses_when_every_connection_is_busy(
    upstream: OpenAIUpstream, start_process_proxy: process_proxy.StartProcessProxy
) -> None:
    proxy = await start_process_proxy(upstream.base_url, max_connections=2)
    upstream.responder = fixed_responder("one two three four five six seven eight nine ten")
    upstream.stream_chunk_delay = 0.2
    async with aiohttp.ClientSession() as first, aiohttp.ClientSession() as second:
        streams = [
            await session.post(proxy.url + "/v1/chat/completions", data=chat_body(stream=True))
            for session in (first, second)
        ]
        assert [stream.status for stream in streams] == [200, 200]
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        try:  # a third connection while both are busy: closed at once (else it would wait for its head)
            async with asyncio.timeout(5):
                assert await reader.read() == b""
        finally:
            writer.close()
        for stream in streams:
            assert (await stream.read()).endswith(b"data: [DONE]\n\n")
    await proxy.wait_for_log(lambda record: record.get("message") == "connection cap cleared")
    assert await timed_health_check(proxy.url) < 1.0


async def test_a_malformed_request_to_the_serve_process_is_one_info_line(
    upstream: OpenAIUpstream, start_process_proxy: process_proxy.StartProcessProxy
) -> None:
    proxy = await start_process_proxy(upstream.base_url)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nBad SECRET: v\r\n\r\n")
        async with asyncio.timeout(5):
            assert b" 400 " in await reader.readuntil(b"\r\n")
    finally:
        writer.close()
    refused = await proxy.wait_for_log(lambda record: record.get("message") == "malformed request refused")
    assert (refused["level"], refused["status"]) == ("info", 400)
    assert "exception" not in refused
    assert not [line for line in proxy.lines if "SECRET" in line or "Traceback" in line]
    assert not [record for record in proxy.records() if record["level"] == "error"]
    assert json.dumps(refused).count("aiohttp") <= 1  # the logger's name only
