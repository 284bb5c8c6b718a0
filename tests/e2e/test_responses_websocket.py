"""The Responses API's WebSocket mode through the real proxy: every `response.create` is compacted as a POST is.

A Codex-shaped agent (`tests.support.codex_client`) runs a long tool loop over one socket to `/v1/responses`, against
the fake upstream's WebSocket mode, with a window it outgrows many times over. The same run over HTTP, against its own
fresh upstream, is the reference: the socket's requests must reach the upstream exactly as the HTTP ones do, so the
pipeline (estimates anchored on the reported usage, compaction, rewrite memory) did the same on both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.codex_client import CodexShapedClient, compacting_responder
from tests.support.openai_upstream import OpenAIUpstream
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


async def test_a_long_run_over_one_socket_is_compacted_as_over_http(upstreams: list[OpenAIUpstream]) -> None:
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
    estimated = "compaction_proxy_estimate_error_ratio_count"
    assert socket_metrics[estimated] == http_metrics[estimated] >= TURNS // 2, "usage reported back, as over HTTP"
