"""Upstream faults: each reaches the client as an accurate status with an OpenAI-style body (or the upstream's own),
a broken stream is never passed off as whole, and the proxy keeps serving afterwards.

Already covered in tests/server: 502 for a refused connection and 504 for a silent upstream (PassThrough compaction),
429/503 relayed with headers (PassThrough). Here: the real compaction service, streaming and not, resets before and
during a response, first-byte and idle timeouts against the fake's delays, the connect timeout, every 5xx and 429
byte for byte, the upstream coming back, and the metrics that count each fault. 502 and 504 bodies say what failed in
plain words, never the upstream's host, port or bytes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from proxy.simulator.openai_upstream import OpenAIUpstream, default_responder, fixed_responder
from tests.reliability.conftest import (
    MakeProxy,
    Proxy,
    assert_serving,
    chat_body,
    openai_error,
    post_chat,
    wait_for,
)

UPSTREAM_DELAY = 5.0
"""Seconds a slow upstream waits before its first byte: far past the proxy's first-byte timeout."""


@pytest.mark.parametrize("stream", [False, True])
async def test_refused_connection_is_a_502_and_the_proxy_recovers_when_the_upstream_returns(
    make_proxy: MakeProxy, http: aiohttp.ClientSession, stream: bool
) -> None:
    first = OpenAIUpstream()
    await first.start()
    port = first.port
    proxy = await make_proxy(first.base_url)
    await first.close()  # the upstream goes away: its port now refuses connections
    for _ in range(3):
        status, _, body = await post_chat(http, proxy, chat_body(stream=stream))
        assert status == 502
        error = openai_error(body)
        assert (error["type"], error["code"]) == ("upstream_error", "upstream_unreachable")
    async with http.get(proxy.url + "/v1/models") as response:
        assert response.status == 502
    assert proxy.metric("compaction_proxy_upstream_errors_total", kind="unreachable") == 4
    async with OpenAIUpstream(port=port):  # it comes back on the same address
        await assert_serving(http, proxy)


@pytest.mark.parametrize("stream", [False, True])
async def test_reset_before_the_response_is_a_502(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession, stream: bool
) -> None:
    upstream.fail_next(reset=True)
    status, _, body = await post_chat(http, proxy, chat_body(stream=stream))
    assert status == 502
    assert openai_error(body)["code"] == "upstream_unreachable"
    upstream.fail_next(reset=True)
    async with http.post(proxy.url + "/v1/embeddings", json={"model": "m", "input": "x"}) as response:
        assert response.status == 502
        assert openai_error(await response.read())["code"] == "upstream_unreachable"
    await assert_serving(http, proxy)


async def test_reset_mid_stream_breaks_the_client_stream_too(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession
) -> None:
    upstream.responder = fixed_responder("one two three four five six seven eight nine ten")
    upstream.fail_next(cut_after_chunks=3)
    headers = {"Authorization": "Bearer sk-test"}
    async with http.post(proxy.url + "/v1/chat/completions", data=chat_body(stream=True), headers=headers) as response:
        assert response.status == 200  # the headers were relayed before the upstream broke off
        received = b""
        with pytest.raises(aiohttp.ClientPayloadError):
            async for chunk in response.content.iter_any():
                received += chunk
    # What did arrive is the upstream's first events, whole; the end ([DONE]) never does: no fake clean end.
    assert received.count(b"data: ") == 3
    assert b"[DONE]" not in received
    assert proxy.metric("compaction_proxy_upstream_errors_total", kind="broken_stream") == 1
    assert proxy.metric("compaction_proxy_requests_total", route="chat_completions", status="200") == 1
    upstream.responder = default_responder
    await assert_serving(http, proxy)


@pytest.mark.parametrize("stream", [False, True])
async def test_slow_first_byte_is_a_504_within_the_first_byte_timeout(
    upstream: OpenAIUpstream, make_proxy: MakeProxy, http: aiohttp.ClientSession, stream: bool
) -> None:
    proxy = await make_proxy(upstream.base_url, first_byte_timeout=0.3)
    upstream.fail_next(delay=UPSTREAM_DELAY)
    started = time.perf_counter()
    status, _, body = await post_chat(http, proxy, chat_body(stream=stream))
    elapsed = time.perf_counter() - started
    assert status == 504
    error = openai_error(body)
    assert (error["type"], error["code"]) == ("upstream_error", "upstream_timeout")
    assert error["message"] == "The upstream timed out: no response within 0.3 seconds."
    assert 0.3 <= elapsed < UPSTREAM_DELAY  # answered at the timeout, not when the upstream answered
    assert proxy.metric("compaction_proxy_upstream_errors_total", kind="timeout") == 1
    # A slow answer inside the limit is fine.
    upstream.delay_first_byte = 0.1
    status, _, body = await post_chat(http, proxy, chat_body(stream=stream))
    assert status == 200, body
    upstream.delay_first_byte = 0.0
    await assert_serving(http, proxy)


async def test_stalled_stream_is_cut_after_the_idle_timeout_and_the_upstream_is_closed(
    upstream: OpenAIUpstream, make_proxy: MakeProxy, http: aiohttp.ClientSession
) -> None:
    proxy = await make_proxy(upstream.base_url, idle_timeout=0.3)
    upstream.stream_chunk_delay = 3.0  # the first event comes at once, the next only after 3 s
    headers = {"Authorization": "Bearer sk-test"}
    async with http.post(proxy.url + "/v1/chat/completions", data=chat_body(stream=True), headers=headers) as response:
        assert response.status == 200
        received = b""
        with pytest.raises(aiohttp.ClientPayloadError):
            async for chunk in response.content.iter_any():
                received += chunk
    assert received.count(b"data: ") == 1
    assert proxy.metric("compaction_proxy_upstream_errors_total", kind="timeout") == 1
    await wait_for(lambda: upstream.streams_aborted == 1)  # the proxy hung up on the stalled upstream
    upstream.stream_chunk_delay = 0.0
    await assert_serving(http, proxy)


async def test_stalled_non_streamed_body_is_cut_after_the_idle_timeout(
    make_proxy: MakeProxy, http: aiohttp.ClientSession
) -> None:
    """Headers and half a JSON body, then silence: the client's connection breaks, it never gets a short body."""
    release = asyncio.Event()

    async def half_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"id": "x",')
        await writer.drain()
        await release.wait()
        writer.close()

    server = await asyncio.start_server(half_answer, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        proxy = await make_proxy(f"http://127.0.0.1:{port}", idle_timeout=0.3)
        for path in ("/v1/chat/completions", "/v1/models"):
            async with http.post(proxy.url + path, data=chat_body()) as response:
                assert response.status == 200
                with pytest.raises(aiohttp.ClientPayloadError):
                    await response.read()
        assert proxy.metric("compaction_proxy_upstream_errors_total", kind="timeout") == 2
    finally:
        release.set()
        server.close()
        await server.wait_closed()


async def test_connect_timeout_is_a_504(
    full_backlog_port: int, make_proxy: MakeProxy, http: aiohttp.ClientSession
) -> None:
    proxy = await make_proxy(f"http://127.0.0.1:{full_backlog_port}", connect_timeout=0.3)
    for stream in (False, True):
        status, _, body = await post_chat(http, proxy, chat_body(stream=stream))
        assert status == 504
        error = openai_error(body)
        assert error["code"] == "upstream_timeout"
        assert error["message"] == "The upstream timed out: timed out connecting."
        assert str(full_backlog_port).encode() not in body
    assert proxy.metric("compaction_proxy_upstream_errors_total", kind="timeout") == 2


RATE_LIMIT_HEADERS = {
    "retry-after": "7",
    "retry-after-ms": "7000",
    "x-ratelimit-limit-requests": "500",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-reset-requests": "7s",
    "x-request-id": "req_fault",
    "openai-processing-ms": "3",
}


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "body",
    [
        None,  # the fake's OpenAI-style body for the status
        b"<html><body><h1>502 Bad Gateway</h1></body></html>",  # a load balancer's page
        b"",
    ],
)
async def test_error_statuses_reach_the_client_with_the_upstreams_headers_and_body(
    upstream: OpenAIUpstream,
    proxy: Proxy,
    http: aiohttp.ClientSession,
    *,
    status: int,
    stream: bool,
    body: bytes | None,
) -> None:
    headers = dict(RATE_LIMIT_HEADERS)
    if body is not None:
        headers["Content-Type"] = "text/html"
    upstream.fail_next(status, body=body, headers=headers)
    got_status, got_headers, got_body = await post_chat(http, proxy, chat_body(stream=stream))
    assert got_status == status
    for name, value in headers.items():
        assert got_headers[name] == value
    if body is None:
        error = openai_error(got_body)
        assert error == json.loads(got_body)["error"]
        assert got_body == json.dumps(json.loads(got_body), indent=2, ensure_ascii=False).encode()
    else:
        assert got_body == body
    assert upstream.chat_requests  # it did reach the upstream (once: no retry of a non-overflow error)
    assert len(upstream.chat_requests) == 1
    await assert_serving(http, proxy)


@pytest.fixture
async def garbling_upstream() -> AsyncIterator[str]:
    """An upstream that answers every request with a malformed status line quoting secret bytes; its base URL."""

    async def garble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 2x0 UPSTREAM-SECRET-BYTES\r\nX-Internal: UPSTREAM-SECRET-BYTES\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(garble, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    ("where", "failure"),
    [
        ("refused", "connection refused"),
        ("unresolvable", "DNS lookup failed"),
        ("garbling", "malformed response"),
    ],
)
async def test_502_bodies_say_what_failed_without_naming_the_upstream_or_echoing_its_bytes(
    make_proxy: MakeProxy,
    http: aiohttp.ClientSession,
    garbling_upstream: str,
    caplog: pytest.LogCaptureFixture,
    *,
    where: str,
    failure: str,
) -> None:
    closed = OpenAIUpstream()
    await closed.start()
    await closed.close()
    upstream_url = {
        "refused": closed.base_url,
        "unresolvable": "http://llm-gateway.internal.invalid:8443",
        "garbling": garbling_upstream,
    }[where]
    host_and_port = upstream_url.removeprefix("http://")
    proxy = await make_proxy(upstream_url)
    caplog.set_level(logging.INFO)
    for path, body in (("/v1/chat/completions", chat_body()), ("/v1/embeddings", b'{"model": "m", "input": "x"}')):
        async with http.post(proxy.url + path, data=body) as response:
            assert response.status == 502
            answer = await response.read()
        error = openai_error(answer)
        assert (error["type"], error["code"]) == ("upstream_error", "upstream_unreachable")
        assert error["message"] == f"The upstream could not be reached: {failure}."
        for secret in (host_and_port, *host_and_port.split(":"), "internal", "UPSTREAM-SECRET"):
            assert secret.encode() not in answer
    warnings = [record for record in caplog.records if record.getMessage().startswith("upstream request failed")]
    assert len(warnings) == 2
    assert all(record.levelno == logging.WARNING for record in warnings)
    assert all(record.__dict__["fields"]["failure"] == failure for record in warnings)
    assert not [record for record in caplog.records if "UPSTREAM-SECRET" in f"{record.getMessage()} {record.__dict__}"]
