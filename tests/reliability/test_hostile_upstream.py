"""A hostile or broken upstream against the response relay: the client gets the upstream's bytes, whole and on time.

The upstream here is `ScriptedUpstream`: a real aiohttp server on 127.0.0.1 that answers every request with exactly
the bytes a test scripts, one write per scripted chunk, plain or gzip-encoded. Each test talks to the real proxy
(real compaction service) with a plain aiohttp client that sees raw bytes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import zlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.config import Settings
from proxy.server.accounting import accounting
from proxy.server.keys import METRICS, SETTINGS
from proxy.server.logging import SERVER_LOGGER
from proxy.server.metrics import ProxyMetrics
from proxy.server.relay import start_response, write
from tests.reliability.conftest import MakeProxy, Proxy, chat_body, wait_for

HEALTHZ_WITHIN = 1.0
"""Seconds `/healthz` may take while a hostile stream is relayed (the finding: 10 s plain, 38.7 s gzip)."""

RELAYED_WITHIN = 30.0
"""Seconds a whole scripted stream may take to reach the client (seconds when linear, minutes when quadratic)."""

PROBE_INTERVAL = 0.01
"""Seconds between two `/healthz` probes: often enough to catch a stall, rarely enough not to cause one."""


class ScriptedUpstream:
    """Answers every request with `chunks`, one write each, as `text/event-stream` (with `encoding` if given).

    :param pace: Let the event loop run after each write, so the proxy reads the chunks one by one instead of many
        at once (the upstream shares the tests' event loop).
    """

    def __init__(self, chunks: list[bytes], *, encoding: str | None = None, pace: bool = False) -> None:
        self.chunks = chunks
        self.encoding = encoding
        self.pace = pace
        self.server = TestServer(self._app(), host="127.0.0.1", port=0)

    @property
    def body(self) -> bytes:
        """Every byte the upstream sends after its headers (before chunked transfer coding)."""
        return b"".join(self.chunks)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        return app

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        headers = {"Content-Type": "text/event-stream"}
        if self.encoding:
            headers["Content-Encoding"] = self.encoding
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        for chunk in self.chunks:
            await response.write(chunk)
            if self.pace:
                await asyncio.sleep(0)
        await response.write_eof()
        return response


@pytest.fixture
async def scripted() -> AsyncIterator[list[ScriptedUpstream]]:
    """Started upstreams (append to start one with `start`), closed at the end."""
    upstreams: list[ScriptedUpstream] = []
    yield upstreams
    for upstream in upstreams:
        await upstream.server.close()


async def start(upstreams: list[ScriptedUpstream], upstream: ScriptedUpstream) -> ScriptedUpstream:
    await upstream.server.start_server()
    upstreams.append(upstream)
    return upstream


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[start : start + size] for start in range(0, len(data), size)]


def gzipped(data: bytes) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    return compressor.compress(data) + compressor.flush()


def event(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def delta(content: str, *, usage_null: bool = False) -> bytes:
    chunk: dict[str, Any] = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": content}}],
    }
    if usage_null:
        chunk["usage"] = None
    return event(chunk)


STREAM_OPTIONS = {"stream_options": {"include_usage": True}}
"""The client asks for usage itself: the proxy edits nothing and relays the stream byte for byte."""


async def stream_through(http: aiohttp.ClientSession, proxy: Proxy, *, strip: bool) -> tuple[int, bytes]:
    """POST a streamed chat completion (the proxy strips the usage it adds when `strip`); return status and body.

    The request passes the window it names in bytes (not in tokens), so the proxy counts it and asks for its usage.
    """
    body = chat_body(stream=True, **({} if strip else STREAM_OPTIONS))
    headers = {"Authorization": "Bearer sk-test", "Content-Type": "application/json", "X-Context-Window": "64"}
    async with asyncio.timeout(RELAYED_WITHIN):
        async with http.post(proxy.url + "/v1/chat/completions", data=body, headers=headers) as response:
            return response.status, await response.read()


class HealthProbe:
    """Probes `/healthz` back to back from a thread with its own event loop, so a stalled proxy loop shows.

    A probe on the proxy's own loop would start late, after a stall, and measure nothing of it.
    """

    def __init__(self, url: str) -> None:
        self.url = url + "/healthz"
        self.stop = threading.Event()
        self.slowest = 0.0
        self.probes = 0

    def run(self) -> None:
        asyncio.run(self._probe())

    async def _probe(self) -> None:
        async with aiohttp.ClientSession() as session:
            while not self.stop.is_set():
                sent = time.perf_counter()
                async with session.get(self.url) as response:
                    assert response.status == 200
                self.slowest = max(self.slowest, time.perf_counter() - sent)
                self.probes += 1
                await asyncio.sleep(PROBE_INTERVAL)


async def stream_while_probing(http: aiohttp.ClientSession, proxy: Proxy, *, strip: bool) -> tuple[bytes, float]:
    """Stream through the proxy while probing `/healthz`; return the body and the slowest probe's round trip."""
    probe = HealthProbe(proxy.url)
    probing = asyncio.create_task(asyncio.to_thread(probe.run))
    try:
        await wait_for(lambda: probe.probes > 0)
        status, body = await stream_through(http, proxy, strip=strip)
    finally:
        probe.stop.set()
        await probing
    assert status == 200
    return body, probe.slowest


@pytest.mark.parametrize("strip", [False, True])
async def test_malformed_chunk_arrives_byte_for_byte_and_the_stream_ends_cleanly(
    make_proxy: MakeProxy, http: aiohttp.ClientSession, scripted: list[ScriptedUpstream], strip: bool
) -> None:
    malformed = [
        event({"choices": 5}),
        event({"choices": [5, {"index": 0, "delta": [1]}]}),
        event({"choices": [{"index": 0, "delta": {"tool_calls": 5, "function_call": 7}}]}),
        event({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": "x"}, {"function": 3}]}}]}),
        event('{"usage": 5, "choices": {"0": 1}}'),
        event("[1, 2"),
        b"data: \xff\xfe not utf-8\n\n",
    ]
    upstream = await start(scripted, ScriptedUpstream([delta("Hel"), *malformed, delta("lo"), event("[DONE]")]))
    proxy = await make_proxy(upstream.url)
    status, body = await stream_through(http, proxy, strip=strip)
    assert status == 200
    assert body == upstream.body  # whole, and ended by the terminating chunk: a cut stream raises in read()
    assert b"HTTP/1.1" not in body
    await assert_serving_healthz(http, proxy)


async def assert_serving_healthz(http: aiohttp.ClientSession, proxy: Proxy) -> None:
    async with http.get(proxy.url + "/healthz") as response:
        assert response.status == 200


@pytest.mark.parametrize("strip", [False, True])
async def test_plain_newline_flood_is_relayed_whole_and_healthz_answers_meanwhile(
    make_proxy: MakeProxy, http: aiohttp.ClientSession, scripted: list[ScriptedUpstream], strip: bool
) -> None:
    upstream = await start(scripted, ScriptedUpstream([delta("a"), *pieces(b"\n" * (4 << 20), 256), event("[DONE]")]))
    proxy = await make_proxy(upstream.url)
    body, slowest = await stream_while_probing(http, proxy, strip=strip)
    assert body == upstream.body
    assert slowest < HEALTHZ_WITHIN


async def test_gzip_newline_bomb_is_relayed_whole_and_healthz_answers_meanwhile(
    make_proxy: MakeProxy, http: aiohttp.ClientSession, scripted: list[ScriptedUpstream]
) -> None:
    bomb = gzipped(delta("a") + b"\n" * (16 << 20) + event("[DONE]"))
    assert len(bomb) < 20 * 1024
    upstream = await start(scripted, ScriptedUpstream(pieces(bomb, 1024), encoding="gzip"))
    proxy = await make_proxy(upstream.url)
    body, slowest = await stream_while_probing(http, proxy, strip=False)
    assert body == bomb  # still compressed: the proxy inflates a copy for inspection only
    assert slowest < HEALTHZ_WITHIN


@pytest.mark.parametrize("strip", [False, True])
async def test_huge_event_in_tiny_chunks_is_relayed_whole(
    make_proxy: MakeProxy, http: aiohttp.ClientSession, scripted: list[ScriptedUpstream], strip: bool
) -> None:
    huge = event({"choices": [{"index": 0, "delta": {"content": "x" * (3 << 20)}}]})
    upstream = await start(scripted, ScriptedUpstream([delta("a"), *pieces(huge, 128), event("[DONE]")], pace=True))
    proxy = await make_proxy(upstream.url)
    body, slowest = await stream_while_probing(http, proxy, strip=strip)
    assert body == upstream.body
    assert slowest < HEALTHZ_WITHIN


async def test_exception_while_inspecting_a_stripped_stream_still_relays_every_byte(
    make_proxy: MakeProxy,
    http: aiohttp.ClientSession,
    scripted: list[ScriptedUpstream],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Two `"usage": null` members defeat the textual cut, and 300 levels of nesting defeat the re-serialization
    # (orjson writes at most 254, raising a TypeError): removing the usage member the proxy caused raises.
    deep = "[" * 300 + "]" * 300
    unremovable = event(f'{{"usage":null,"usage":null,"choices":[],"deep":{deep}}}')
    usage = event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})
    rest = [delta("b", usage_null=True), usage, event("[DONE]")]
    upstream = await start(
        scripted, ScriptedUpstream([delta("a", usage_null=True), unremovable[:40], unremovable[40:], *rest])
    )
    proxy = await make_proxy(upstream.url)
    with caplog.at_level(logging.INFO, logger=SERVER_LOGGER):
        status, body = await stream_through(http, proxy, strip=True)
    assert status == 200
    assert body == delta("a") + unremovable + b"".join(rest)  # edited until the failure, untouched from there on
    assert proxy.metric("compaction_proxy_fail_open_total", stage="inspect") == 1
    failures = [
        record for record in caplog.records if record.name == SERVER_LOGGER and record.levelno >= logging.WARNING
    ]
    assert [getattr(record, "fields", {}).get("error") for record in failures] == ["TypeError"]
    await assert_serving_healthz(http, proxy)


async def test_failure_after_the_response_started_cuts_the_connection_instead_of_answering_twice(
    scripted: list[ScriptedUpstream], caplog: pytest.LogCaptureFixture
) -> None:
    upstream = await start(scripted, ScriptedUpstream([delta("a"), event("[DONE]")]))

    async def failing_midway(request: web.Request) -> web.StreamResponse:
        async with aiohttp.ClientSession() as session, session.get(upstream.url) as response:
            out = await start_response(request, response)
            await write(request, out, await response.content.readany())
            raise RuntimeError("a proxy bug, after the first bytes went out")

    app = web.Application(middlewares=[accounting])
    app[SETTINGS] = Settings(upstream=upstream.url)
    app[METRICS] = ProxyMetrics()
    app.router.add_get("/", failing_midway)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        with caplog.at_level(logging.INFO, logger=SERVER_LOGGER):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            async with asyncio.timeout(10):
                received = await reader.read()  # until the proxy closes the connection
            writer.close()
    finally:
        await server.close()
    assert received.startswith(b"HTTP/1.1 200 OK\r\n")
    assert received.count(b"HTTP/1.1") == 1  # no second response spliced into the body
    assert not received.endswith(b"0\r\n\r\n")  # no terminating chunk: the client sees a cut, not a clean end
    assert [record.levelno for record in caplog.records if record.name == SERVER_LOGGER] == [logging.ERROR]
