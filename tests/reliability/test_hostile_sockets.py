"""Hostile round 4 on the WebSocket tunnel: sockets through the real proxy on loopback, against the fake upstream.

Each test is an attack that got through an earlier version: a `response.create` nested deeper than the proxy writes
JSON, upstream `error` events that name no lane, sockets pinged to hold every connection slot, and compressed
messages inflated on their way upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestServer

from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.reliability.conftest import MakeProxy
from tests.support import process_proxy

MODEL = "gpt-4.1"
start_process_proxy = process_proxy.start_process_proxy


def create(**body: Any) -> str:
    """A `response.create` message for `MODEL`."""
    return json.dumps({"type": "response.create", "model": MODEL, **body})


def nested(depth: int) -> str:
    """A `response.create` whose `metadata` nests arrays `depth` levels deep."""
    return create(input="hi")[:-1] + ', "metadata": ' + "[" * depth + "]" * depth + "}"


async def answer(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    """The event that ends the next answer on `ws` (`response.completed` or `error`); fails if the socket closes."""
    while True:
        message = await ws.receive()
        assert message.type is WSMsgType.TEXT, (message.type, ws.close_code)
        event: dict[str, Any] = json.loads(message.data)
        if event["type"] in ("response.completed", "error"):
            return event


@pytest.mark.parametrize("depth", [300, 900])
async def test_a_create_nested_too_deep_to_write_is_forwarded_untouched_as_over_http(
    upstream: OpenAIUpstream, make_proxy: MakeProxy, caplog: pytest.LogCaptureFixture, depth: int
) -> None:
    proxy = await make_proxy(upstream.base_url)
    caplog.set_level(logging.INFO)
    deep = nested(depth)
    async with aiohttp.ClientSession() as session:
        body = json.dumps({key: value for key, value in json.loads(deep).items() if key != "type"})
        async with session.post(proxy.url + "/v1/responses", data=body) as over_http:
            http_status = over_http.status
        async with session.ws_connect(proxy.url + "/v1/responses") as ws:
            for _ in range(2):
                await ws.send_str(deep)
                event = await answer(ws)
                assert event.get("status", 200) == http_status, "the upstream's own answer, as over HTTP"
            await ws.send_str(create(input="and then a plain one"))
            assert (await answer(ws))["type"] == "response.completed", "the socket stays open"
    sent = [request for request in upstream.requests if request.method == "WEBSOCKET"]
    assert len(sent) == 3
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


LANE_MESSAGES = 150
LANE_TEXT = 230_000


@pytest.fixture
async def refusing_socket_upstream() -> AsyncIterator[str]:
    """An upstream whose Responses socket refuses every create with an `error` event, as OpenAI's does.

    The event carries the create's `stream_id` when the socket's URL asks for it (`?lanes=1`), else none.
    """

    async def refuse(request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse(max_msg_size=0)
        await socket.prepare(request)
        async for message in socket:
            lane = json.loads(message.data).get("stream_id") if request.query.get("lanes") else None
            error = {"type": "invalid_request_error", "code": "rate_limit_exceeded", "message": "Slow down."}
            await socket.send_str(json.dumps({"type": "error", "status": 429, "error": error, "stream_id": lane}))
        return socket

    app = web.Application()
    app.router.add_get("/v1/responses", refuse)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    yield str(server.make_url(""))
    await server.close()


async def growth_over_refused_lanes(proxy: process_proxy.ProcessProxy, query: str) -> int:
    """Send `LANE_MESSAGES` large creates, each on a lane of its own, one answer at a time; return the RSS growth."""
    before = proxy.rss_bytes()
    url = f"{proxy.url}/v1/responses{query}"
    async with aiohttp.ClientSession() as session, session.ws_connect(url, max_msg_size=0) as ws:
        for number in range(LANE_MESSAGES):
            await ws.send_str(create(input=f"{number} " + "y" * LANE_TEXT, stream_id=f"lane-{number}"))
            assert (await answer(ws))["status"] == 429
        return proxy.rss_bytes() - before


async def test_error_events_without_a_lane_release_what_the_socket_keeps(
    refusing_socket_upstream: str, start_process_proxy: process_proxy.StartProcessProxy
) -> None:
    """Requests waiting for an answer are released by an ending without a lane as by one with it."""
    with_lanes = await start_process_proxy(refusing_socket_upstream)
    control = await growth_over_refused_lanes(with_lanes, "?lanes=1")
    without_lanes = await start_process_proxy(refusing_socket_upstream)
    attack = await growth_over_refused_lanes(without_lanes, "")
    kept = LANE_MESSAGES * LANE_TEXT
    assert attack < control + kept / 2, (attack, control, kept)


CONNECTIONS = 20


async def health(url: str) -> int:
    """The status of `GET /healthz` on a new connection."""
    async with aiohttp.ClientSession() as session, session.get(url + "/healthz") as response:
        return response.status


async def test_pinged_sockets_cannot_hold_every_connection(
    upstream: OpenAIUpstream, start_process_proxy: process_proxy.StartProcessProxy
) -> None:
    """As many sockets as connections, kept open with pings: half get in, the rest are refused, health answers."""
    proxy = await start_process_proxy(upstream.base_url, max_connections=CONNECTIONS, idle_timeout=6)
    echo = proxy.url.replace("http://", "ws://") + "/echo/x"
    async with contextlib.AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(aiohttp.ClientSession()) for _ in range(CONNECTIONS)]
        sockets: list[aiohttp.ClientWebSocketResponse] = []
        refused: list[int] = []
        for session in sessions:
            try:
                sockets.append(await stack.enter_async_context(session.ws_connect(echo, autoping=False)))
            except aiohttp.WSServerHandshakeError as error:
                refused.append(error.status)
        for round_ in range(3):
            for ws in sockets:
                await ws.ping(b"still here")
                assert (await ws.receive()).type is WSMsgType.PONG
            assert await health(proxy.url) == 200, f"round {round_}"
        assert (len(sockets), refused) == (CONNECTIONS // 2, [503] * (CONNECTIONS - CONNECTIONS // 2))
        await sockets.pop().close()
        await proxy.wait_for_log(lambda record: record.get("status") == 101)
        async with sessions[0].ws_connect(echo) as again:  # a closed socket's slot is free again
            await again.send_str("in")
            assert (await again.receive()).data == "in"
    refusals = [record for record in proxy.records() if record.get("error") == "too_many_websockets"]
    assert len(refusals) == CONNECTIONS - CONNECTIONS // 2


class CountingRelay:
    """A TCP relay on loopback to `port`: what each connection sends through it, counted (bytes to `port`)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sent = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen on a free loopback port; return it."""
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        await asyncio.gather(self._pump(client_reader, writer, True), self._pump(reader, client_writer, False))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counted: bool) -> None:
        try:
            while chunk := await reader.read(1 << 16):
                self.sent += len(chunk) if counted else 0
                writer.write(chunk)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


@contextlib.asynccontextmanager
async def sizing_upstream(deflates: bool) -> AsyncIterator[tuple[int, CountingRelay]]:
    """An upstream socket that answers each message with its size, accepting permessage-deflate if `deflates`;
    behind a relay counting the bytes sent to it. Yields the relay's port and the relay."""

    async def sizes(request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse(max_msg_size=0, compress=deflates)
        await socket.prepare(request)
        async for message in socket:
            await socket.send_str(str(len(message.data)))
        return socket

    app = web.Application()
    app.router.add_get("/sizes", sizes)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    assert server.port is not None
    relay = CountingRelay(server.port)
    try:
        yield await relay.start(), relay
    finally:
        relay.close()
        await server.close()


DEFLATED_MESSAGES = 4
DEFLATED_SIZE = 16 << 20


@pytest.mark.parametrize("deflates", [True, False], ids=["upstream-deflates", "upstream-does-not"])
async def test_a_compressed_message_reaches_the_upstream_no_larger_than_the_client_sent_it(
    make_proxy: MakeProxy, deflates: bool
) -> None:
    """Compression is negotiated end to end: the upstream never gets a message inflated from a compressed one."""
    async with sizing_upstream(deflates) as (upstream_port, upstream_side):
        proxy = await make_proxy(f"http://127.0.0.1:{upstream_port}")
        client_side = CountingRelay(proxy.port)
        try:
            url = f"ws://127.0.0.1:{await client_side.start()}/sizes"
            async with aiohttp.ClientSession() as session, session.ws_connect(url, compress=15, max_msg_size=0) as ws:
                for number in range(DEFLATED_MESSAGES):
                    await ws.send_bytes(bytes([number]) * DEFLATED_SIZE)
                    assert (await ws.receive()).data == str(DEFLATED_SIZE)
                compressed = ws.compress != 0
        finally:
            client_side.close()
    assert compressed is deflates
    assert upstream_side.sent < 2 * client_side.sent + 4096, (upstream_side.sent, client_side.sent)


async def test_a_compressed_message_is_bounded_inflated_like_a_body(make_proxy: MakeProxy) -> None:
    """What a compressed message inflates to is bounded by `max_body_bytes`, as a gzip body's is: 1009, not relayed."""
    async with sizing_upstream(True) as (upstream_port, upstream_side):
        proxy = await make_proxy(f"http://127.0.0.1:{upstream_port}", max_body_bytes=1 << 20)
        url = f"ws://127.0.0.1:{proxy.port}/sizes"
        async with aiohttp.ClientSession() as session, session.ws_connect(url, compress=15, max_msg_size=0) as ws:
            await ws.send_bytes(b"x" * (2 << 20))
            assert (await ws.receive()).type is WSMsgType.CLOSE
            assert ws.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
    assert upstream_side.sent < 4096, "the handshake and the close only"
