"""Client faults: a client leaving mid-stream stops the upstream's generation; slow or oversized request bodies and
heads are bounded by limits and timeouts; the proxy keeps serving afterwards.

Already covered in tests/server: 413 for bodies over `max_body_bytes` (declared and chunked), and a raw upstream
seeing the proxy hang up when the client leaves. Here: the same against the fake's own stream handler (it records
the abort), many clients leaving at once, the body pause limit, declared-huge bodies, and the head limits.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest

from proxy.server.logging import CONNECTION_LOGGER
from proxy.simulator.openai_upstream import OpenAIUpstream, default_responder, fixed_responder
from tests.reliability.conftest import MakeProxy, Proxy, assert_serving, chat_body, openai_error, wait_for

LONG_REPLY = " ".join(f"word{i}" for i in range(400))


async def read_events(response: aiohttp.ClientResponse, count: int) -> list[bytes]:
    """Read `count` SSE events from a streamed response."""
    return [await response.content.readuntil(b"\n\n") for _ in range(count)]


async def test_client_leaving_mid_stream_cancels_the_upstream_stream(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession
) -> None:
    upstream.responder = fixed_responder(LONG_REPLY)
    upstream.stream_chunk_delay = 0.02  # ~400 events: the whole stream would take 8 s
    response = await http.post(
        proxy.url + "/v1/chat/completions", data=chat_body(stream=True), headers={"Authorization": "Bearer sk-test"}
    )
    assert response.status == 200
    events = await read_events(response, 3)
    assert all(event.startswith(b"data: {") for event in events)
    response.close()  # the client goes away
    await asyncio.wait_for(upstream.abort_event.wait(), timeout=5)
    assert (upstream.streams_started, upstream.streams_aborted, upstream.streams_completed) == (1, 1, 0)
    await wait_for(lambda: proxy.metric("compaction_proxy_in_flight_requests") == 0)
    upstream.stream_chunk_delay = 0.0
    upstream.responder = default_responder
    await assert_serving(http, proxy)


async def test_many_clients_leaving_at_once_leave_nothing_behind(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession
) -> None:
    upstream.responder = fixed_responder(LONG_REPLY)
    upstream.stream_chunk_delay = 0.02
    clients = 50

    async def leave_early() -> None:
        async with aiohttp.ClientSession() as own:
            response = await own.post(proxy.url + "/v1/chat/completions", data=chat_body(stream=True))
            assert response.status == 200
            await read_events(response, 2)
            response.close()

    await asyncio.gather(*(leave_early() for _ in range(clients)))
    await wait_for(lambda: upstream.streams_aborted == clients)
    assert upstream.streams_completed == 0
    await wait_for(lambda: proxy.metric("compaction_proxy_in_flight_requests") == 0)
    upstream.stream_chunk_delay = 0.0
    upstream.responder = default_responder
    await assert_serving(http, proxy)


async def raw_exchange(port: int, head: bytes, body_part: bytes = b"", within: float = 10.0) -> bytes:
    """Send a request head and part of a body, then wait (without sending more) for the whole answer.

    The answer is read by its Content-Length, not to the connection's end: after answering a request whose body it
    did not read, aiohttp keeps the connection up to `lingering_time` (10 s) reading and discarding the rest, then
    closes it, so a client still uploading sees the answer instead of a reset.
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + body_part)
        await writer.drain()
        return await read_answer(reader, within)
    finally:
        writer.close()


async def read_answer(reader: asyncio.StreamReader, within: float) -> bytes:
    """Read one answer (head and Content-Length body) from a raw connection, within `within` seconds."""
    async with asyncio.timeout(within):
        answer_head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in answer_head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return answer_head + await reader.readexactly(length)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def body_of(answer: bytes) -> bytes:
    return answer.partition(b"\r\n\r\n")[2]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/echo/upload"])
async def test_a_stalled_request_body_gets_408_after_the_pause_limit(
    upstream: OpenAIUpstream, make_proxy: MakeProxy, http: aiohttp.ClientSession, path: str
) -> None:
    proxy = await make_proxy(upstream.base_url, client_body_timeout=0.3)
    loop = asyncio.get_running_loop()
    started = loop.time()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    answer = await raw_exchange(proxy.port, head.encode(), b'{"model": "gpt-4o-mini", "messa')
    assert loop.time() - started < 5
    assert status_of(answer) == 408
    error = openai_error(body_of(answer))
    assert (error["type"], error["code"]) == ("invalid_request_error", "request_timeout")
    assert all(not request.body for request in upstream.requests if request.path == path)
    assert (
        proxy.metric("compaction_proxy_requests_total", route="chat_completions", status="408")
        + proxy.metric("compaction_proxy_requests_total", route="other", status="408")
        == 1
    )
    await assert_serving(http, proxy)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/echo/upload"])
async def test_a_trickled_request_body_gets_408_once_below_the_minimum_rate(
    upstream: OpenAIUpstream,
    make_proxy: MakeProxy,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    path: str,
) -> None:
    """A byte every 50 ms never pauses for `client_body_timeout`, but at 20 B/s it falls below a 100 B/s minimum:
    cut after 0.5 + N / 100 seconds, N the bytes sent by then (about 0.7 s)."""
    proxy = await make_proxy(upstream.base_url, client_body_timeout=0.5, client_body_min_rate=100)
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    writer.write(head.encode())
    started = loop.time()

    async def trickle() -> None:
        for _ in range(1000):
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.05)

    trickling = asyncio.create_task(trickle())
    try:
        answer = await read_answer(reader, within=5)
    finally:
        trickling.cancel()
        writer.close()
    assert 0.5 < loop.time() - started < 2.5
    assert status_of(answer) == 408
    assert openai_error(body_of(answer))["code"] == "request_timeout"
    # The client's fault: not reported to the operator as an upstream failure.
    assert not [record for record in caplog.records if record.getMessage().startswith("upstream request failed")]
    await assert_serving(http, proxy)


async def test_a_slow_but_steady_body_is_accepted(
    upstream: OpenAIUpstream, make_proxy: MakeProxy, http: aiohttp.ClientSession
) -> None:
    """The limit is on pauses, not on the whole upload: a body trickling in faster than that goes through."""
    proxy = await make_proxy(upstream.base_url, client_body_timeout=0.5)
    body = chat_body()

    async def trickle() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 20):
            await asyncio.sleep(0.05)
            yield body[start : start + 20]

    async with http.post(proxy.url + "/v1/chat/completions", data=trickle()) as response:
        assert response.status == 200
        assert json.loads(await response.read())["choices"][0]["message"]["content"] == "ok 2 messages"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/echo/upload"])
async def test_a_declared_huge_body_is_refused_before_it_is_read(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession, path: str
) -> None:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {10**12}\r\n\r\n"
    answer = await raw_exchange(proxy.port, head.encode(), b"{")
    assert status_of(answer) == 413
    assert openai_error(body_of(answer))["code"] == "request_too_large"
    assert not [request for request in upstream.requests if request.path == path]
    await assert_serving(http, proxy)


@pytest.mark.parametrize(
    "head",
    [
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",  # one header too long
        b"GET /v1/models?q=" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # request line too long
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(200)) + b"\r\n",
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nBad Header: v\r\n\r\n",  # not a token
    ],
    ids=["header-too-long", "request-line-too-long", "too-many-headers", "malformed-header"],
)
async def test_oversized_or_malformed_request_heads_are_refused_before_any_handler(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession, head: bytes
) -> None:
    answer = await raw_exchange(proxy.port, head)
    assert 400 <= status_of(answer) < 500
    assert upstream.requests == []
    await assert_serving(http, proxy)


@pytest.mark.parametrize(
    "head",
    [
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: SECRET" + b"a" * 9000 + b"\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nBad SECRET: v\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: SECRET\r\n\r\n",
        b"GET /v1/models SECRET/1.1\r\nHost: x\r\n\r\n",
    ],
    ids=["header-too-long", "malformed-header", "bad-content-length", "bad-version"],
)
async def test_a_malformed_request_is_one_info_line_without_traceback_or_request_bytes(
    proxy: Proxy, caplog: pytest.LogCaptureFixture, head: bytes
) -> None:
    caplog.set_level(logging.DEBUG, logger=CONNECTION_LOGGER)
    answer = await raw_exchange(proxy.port, head)
    assert status_of(answer) == 400
    records = [record for record in caplog.records if record.name == CONNECTION_LOGGER]
    (record,) = records
    assert (record.levelno, record.getMessage()) == (logging.INFO, "malformed request refused")
    assert record.exc_info is None
    assert record.__dict__["fields"]["status"] == 400
    assert "SECRET" not in str(record.__dict__)


async def test_head_limits_come_from_the_settings(
    upstream: OpenAIUpstream, make_proxy: MakeProxy, http: aiohttp.ClientSession
) -> None:
    token = "eyJ" + "a" * 12_000  # a large JWT, beyond aiohttp's default 8190
    headers = {"Authorization": f"Bearer {token}"}
    default = await make_proxy(upstream.base_url)
    async with http.get(default.url + "/healthz", headers=headers) as response:
        assert response.status == 400
    roomy = await make_proxy(upstream.base_url, max_header_bytes=16_384, max_headers=300)
    async with http.get(roomy.url + "/healthz", headers=headers) as response:
        assert response.status == 200
    many = {f"X-H{i}": "v" for i in range(200)}
    async with http.get(default.url + "/healthz", headers=many) as response:
        assert response.status == 400
    async with http.get(roomy.url + "/healthz", headers=many) as response:
        assert response.status == 200
