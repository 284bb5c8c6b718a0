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
from yarl import URL

from proxy.config import Settings
from proxy.server.accounting import accounting
from proxy.server.keys import METRICS, SETTINGS
from proxy.server.logging import SERVER_LOGGER
from proxy.server.metrics import ProxyMetrics
from proxy.server.relay import start_response, write
from tests.reliability.conftest import MakeProxy, Proxy, chat_body, wait_for
from tests.support.stalls import ControlServer, HealthProbe, assert_no_stall

RELAYED_WITHIN = 30.0
"""Seconds a whole scripted stream may take to reach the client (seconds when linear, minutes when quadratic)."""


class ScriptedUpstream:
    """Answers every request with `chunks`, one write each, as `text/event-stream` (with `encoding` if given).

    It serves from a thread and event loop of its own, so its writes never hold up the proxy's loop and a probe of
    the proxy measures the proxy alone.

    :param pace: Let the upstream's loop run after each write, so the proxy reads the chunks one by one instead of
        many at once.
    """

    def __init__(self, chunks: list[bytes], *, encoding: str | None = None, pace: bool = False) -> None:
        self.chunks = chunks
        self.encoding = encoding
        self.pace = pace
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    @property
    def body(self) -> bytes:
        """Every byte the upstream sends after its headers (before chunked transfer coding)."""
        return b"".join(self.chunks)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.thread.start()
        self.server = TestServer(self._app(), host="127.0.0.1", port=0)
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.server.start_server(), self.loop))
        self.port = self.server.port or 0

    async def close(self) -> None:
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.server.close(), self.loop))
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self.thread.join)
        self.loop.close()

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
        await upstream.close()


async def start(upstreams: list[ScriptedUpstream], upstream: ScriptedUpstream) -> ScriptedUpstream:
    await upstream.start()
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


async def stream_while_probing(http: aiohttp.ClientSession, proxy: Proxy, *, strip: bool) -> bytes:
    """Stream through the proxy while probing `/healthz`, assert the proxy's loop never stalled, return the body.

    The relay is the work the probes are judged against (`assert_no_stall`): the findings (10 s plain, 38.7 s gzip)
    were waits as long as the relay itself.
    """
    url = URL(proxy.url)
    assert url.host is not None and url.port is not None
    idle = HealthProbe(url.host, url.port)
    await wait_for(lambda: len(idle.waits) >= 30)
    quiet = max(idle.stop())
    with ControlServer() as machine:
        probe, control = HealthProbe(url.host, url.port), HealthProbe("127.0.0.1", machine.port)
        try:
            await wait_for(lambda: len(probe.waits) > 0 and len(control.waits) > 0)
            started = time.perf_counter()
            status, body = await stream_through(http, proxy, strip=strip)
            relayed = time.perf_counter() - started
        finally:
            waits, machine_waits = probe.stop(), control.stop()
    assert status == 200
    assert_no_stall(waits, relayed, quiet, machine_waits)
    return body


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
    assert await stream_while_probing(http, proxy, strip=strip) == upstream.body


async def test_gzip_newline_bomb_is_relayed_whole_and_healthz_answers_meanwhile(
    make_proxy: MakeProxy, http: aiohttp.ClientSession, scripted: list[ScriptedUpstream]
) -> None:
    bomb = gzipped(delta("a") + b"\n" * (64 << 20) + event("[DONE]"))
    assert len(bomb) < 80 * 1024
    upstream = await start(scripted, ScriptedUpstream(pieces(bomb, 1024), encoding="gzip"))
    proxy = await make_proxy(upstream.url)
    # still compressed: the proxy inflates a copy for inspection only
    assert await stream_while_probing(http, proxy, strip=False) == bomb


async def test_a_client_slower_than_the_idle_timeout_gets_the_whole_stream(
    make_proxy: MakeProxy, http: aiohttp.ClientSession, scripted: list[ScriptedUpstream]
) -> None:
    """The idle timeout counts the upstream's silence only, never the time the relay waits on a slow client.

    The answer (32 MiB) is more than the sockets between the proxy and the client hold, so while the client reads
    nothing the proxy's relay waits on its write, three idle timeouts long, with the upstream's next bytes ready.
    """
    upstream = await start(scripted, ScriptedUpstream([delta("x" * 1000, usage_null=True)] * (32 << 10)))
    proxy = await make_proxy(upstream.url, idle_timeout=0.3)
    body = chat_body(stream=True, **STREAM_OPTIONS)
    headers = {"Authorization": "Bearer sk-test", "Content-Type": "application/json"}
    async with http.post(proxy.url + "/v1/chat/completions", data=body, headers=headers) as response:
        assert response.status == 200
        first = await response.content.readany()
        await asyncio.sleep(1.0)  # the slow client: nothing read for over three idle timeouts
        received = first + await response.read()
    assert received == upstream.body
    assert proxy.metric("compaction_proxy_upstream_errors_total", kind="timeout") == 0


@pytest.mark.parametrize("strip", [False, True])
async def test_huge_event_in_tiny_chunks_is_relayed_whole(
    make_proxy: MakeProxy, http: aiohttp.ClientSession, scripted: list[ScriptedUpstream], strip: bool
) -> None:
    huge = event({"choices": [{"index": 0, "delta": {"content": "x" * (3 << 20)}}]})
    upstream = await start(scripted, ScriptedUpstream([delta("a"), *pieces(huge, 128), event("[DONE]")], pace=True))
    proxy = await make_proxy(upstream.url)
    assert await stream_while_probing(http, proxy, strip=strip) == upstream.body


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
