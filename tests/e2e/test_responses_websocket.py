"""The Responses API's WebSocket mode through the real proxy: every `response.create` is compacted as a POST is.

A Codex-shaped agent (`tests.support.codex_client`) runs a long tool loop over one socket to `/v1/responses`, against
the fake upstream's WebSocket mode, with a window it outgrows many times over. The same run over HTTP, against its own
fresh upstream, is the reference: the socket's requests must reach the upstream exactly as the HTTP ones do, so the
pipeline (estimates anchored on the reported usage, compaction, rewrite memory) did the same on both.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from proxy.formats.responses.socket import create_message, refusal_event
from proxy.pipeline.exchange import Refusal
from proxy.server.logging import ACCESS_LOGGER
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.support.codex_client import CodexShapedClient, compacting_responder
from tests.support.proxies import LoopbackProxies

MODEL = "gpt-4.1"
WINDOW = 6000
TURNS = 40
PLAIN_CLIENT = {"User-Agent": "python-aiohttp"}
"""Not recognized as a client that compacts itself: the proxy compacts at its trigger."""


@pytest.fixture
async def upstreams() -> AsyncIterator[list[OpenAIUpstream]]:
    """Two identical fresh upstreams: one for the run over HTTP, one for the run over the socket."""
    fakes = [OpenAIUpstream(context_window=WINDOW, responses_responder=compacting_responder()) for _ in range(2)]
    for fake in fakes:
        await fake.start()
    yield fakes
    for fake in fakes:
        await fake.close()


async def run(upstream: OpenAIUpstream, *, websocket: bool) -> tuple[CodexShapedClient, dict[str, float]]:
    """Run the agent through a fresh proxy in front of `upstream`; return it and the proxy's metrics after."""
    proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={MODEL: WINDOW}, offload=False)
    proxy = await proxies.start()
    client = CodexShapedClient(proxy.url, MODEL, auto_compact_tokens=10**9, headers=PLAIN_CLIENT, websocket=websocket)
    try:
        await client.run(turns=TURNS)
        return client, await metrics_of(proxy.url)
    finally:
        await proxies.close()


async def metrics_of(proxy_url: str) -> dict[str, float]:
    """The proxy's unlabelled samples and histogram counts, by name."""
    async with aiohttp.ClientSession() as session, session.get(proxy_url.removesuffix("/v1") + "/metrics") as answer:
        text = await answer.text()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


async def test_a_long_run_over_one_socket_is_compacted_as_over_http(
    upstreams: list[OpenAIUpstream], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    over_http, over_socket = upstreams
    _, http_metrics = await run(over_http, websocket=False)
    socket_client, socket_metrics = await run(over_socket, websocket=True)

    assert socket_client.sockets == 1, "one socket for the whole run: no reconnect"
    handshakes = [request for request in over_socket.requests if request.method == "GET"]
    assert len(handshakes) == 1
    assert [exchange.status for exchange in socket_client.exchanges] == [200] * TURNS
    assert over_socket.responses_requests == over_http.responses_requests, "the same pipeline, the same requests"
    assert over_socket.responses_usages == over_http.responses_usages

    sent = [over_socket.responses_service.count(exchange.body)["input_tokens"] for exchange in socket_client.exchanges]
    received = [usage["input_tokens"] for usage in over_socket.responses_usages]
    compacted = [turn for turn, (before, after) in enumerate(zip(sent, received, strict=True)) if after < before]
    assert sent[-1] > 2 * WINDOW, "the conversation outgrew the window"
    assert len(compacted) >= TURNS // 2, "compacted once over the trigger"
    assert max(received) < WINDOW
    lines = [getattr(record, "fields", {}) for record in caplog.records if record.getMessage() == "websocket message"]
    assert len(lines) == TURNS
    assert {line["compaction"] for line in lines} >= {"compacted", "unchanged"}
    assert all(line["tokens_after"] < line["tokens_before"] for line in lines if line["compaction"] == "compacted")
    assert "Fix the failing tests" not in caplog.text, "no message content in the logs"
    estimated = "compaction_proxy_estimate_error_ratio_count"
    assert socket_metrics[estimated] == http_metrics[estimated] >= TURNS // 2, "usage reported back, as over HTTP"


@pytest.fixture
async def upstream() -> AsyncIterator[OpenAIUpstream]:
    async with OpenAIUpstream(context_window=WINDOW) as fake:
        yield fake


async def socket_events(proxy_url: str, messages: list[bytes], answers: int) -> list[dict[str, Any]]:
    """Send `messages` on one socket to `/v1/responses`; return the events received until `answers` responses ended."""
    ended: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as session, session.ws_connect(proxy_url + "/responses") as ws:
        for message in messages:
            await ws.send_str(message.decode())
        while len(ended) < answers:
            event = json.loads((await ws.receive()).data)
            events.append(event)
            if event["type"] in ("response.completed", "error"):
                ended.append(event)
    return events


def create(**body: Any) -> bytes:
    return json.dumps({"type": "response.create", "model": MODEL, **body}).encode()


async def test_a_chain_kept_by_the_upstream_continues_on_the_socket(upstream: OpenAIUpstream) -> None:
    proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={MODEL: WINDOW})
    proxy = await proxies.start()
    try:
        async with aiohttp.ClientSession() as session, session.ws_connect(proxy.url + "/responses") as ws:
            await ws.send_str(create(input="first", store=False).decode())
            first = await until_completed(ws)
            await ws.send_str(create(input="second", store=False, previous_response_id=first["id"]).decode())
            second = await until_completed(ws)
    finally:
        await proxies.close()
    assert second["output"][0]["content"][0]["text"] == "ok 3 items", "the first turn, its answer, the new input"
    assert upstream.responses_requests[-1]["previous_response_id"] == first["id"]


async def until_completed(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    while True:
        event = json.loads((await ws.receive()).data)
        assert event["type"] != "error", event
        if event["type"] == "response.completed":
            response: dict[str, Any] = event["response"]
            return response


async def test_a_request_over_the_limits_is_answered_on_the_socket_and_not_forwarded(upstream: OpenAIUpstream) -> None:
    proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={MODEL: WINDOW}, max_messages=2)
    proxy = await proxies.start()
    try:
        events = await socket_events(
            proxy.url, [create(input=["a", "b", "c"]), create(input="then a small one")], answers=2
        )
    finally:
        await proxies.close()
    refusal = events[0]
    assert (refusal["type"], refusal["status"], refusal["error"]["code"]) == ("error", 400, "too_many_messages")
    assert events[-1]["type"] == "response.completed", "the socket stays open"
    assert [request["input"] for request in upstream.responses_requests] == ["then a small one"]


async def test_what_the_proxy_does_not_read_passes_untouched(upstream: OpenAIUpstream) -> None:
    proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={MODEL: WINDOW})
    proxy = await proxies.start()
    unknown = b'{"type": "response.append", "input": "x"}'
    try:
        events = await socket_events(proxy.url, [b"not json", unknown, create(input="hi", stream_id="lane-2")], 3)
    finally:
        await proxies.close()
    assert [event["type"] for event in events[:2]] == ["error", "error"], "the upstream's answers to each"
    assert "'response.append'" in events[1]["error"]["message"]
    assert {event.get("stream_id") for event in events[2:]} == {"lane-2"}


@given(
    body=st.dictionaries(st.text(max_size=8).filter(lambda key: key != "type"), st.integers() | st.text(), max_size=5)
)
def test_a_planned_body_becomes_a_create_message(body: dict[str, Any]) -> None:
    for spaced in (json.dumps(body).encode(), json.dumps(body, indent=2).encode()):
        assert json.loads(create_message(spaced)) == {"type": "response.create", **body}


@given(status=st.sampled_from([400, 413]), code=st.text(min_size=1, max_size=20), param=st.none() | st.text(max_size=9))
def test_a_refusal_is_an_error_event(status: int, code: str, param: str | None) -> None:
    event = json.loads(refusal_event(Refusal(status, "over the limit", code, param)))
    assert event == {
        "type": "error",
        "status": status,
        "error": {"type": "invalid_request_error", "code": code, "message": "over the limit", "param": param},
    }
