"""Hostile round 4 on the WebSocket tunnel: sockets through the real proxy on loopback, against the fake upstream.

Each test is an attack that got through an earlier version: a `response.create` nested deeper than the proxy writes
JSON, upstream `error` events that name no lane, sockets pinged to hold every connection slot, and compressed
messages inflated on their way upstream.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType

from tests.reliability.conftest import MakeProxy
from tests.support.openai_upstream import OpenAIUpstream

MODEL = "gpt-4.1"


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
