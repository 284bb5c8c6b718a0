"""One proxy, several upstreams: each request reaches the provider of its API, or the upstream a route names.

Two fake providers at once (OpenAI's chat completions and Responses, Anthropic's Messages API) behind one proxy given
nothing but their two origins, with the official `openai` and `anthropic` SDKs pointed at that one proxy: long runs of
each compact, and no request reaches the other provider. Routes by model pattern and by header take their requests to
a third upstream (the `upstream` fixture: a local model server, or the ChatGPT backend), a WebSocket (Codex's ChatGPT
login, at the ChatGPT backend's path) included.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from anthropic import AsyncAnthropic

from proxy.server.keys import METRICS
from proxy.simulator.anthropic_upstream import AnthropicUpstream
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.support.codex_client import CodexShapedClient, compacting_responder
from tests.support.format_agents import AGENTS
from tests.support.process_proxy import ProcessProxy
from tests.support.proxies import LoopbackProxies, RunningProxy
from tests.support.wire_formats import CHAT_COMPLETIONS, MESSAGES, RESPONSES

TURNS = 120
LOCAL_MODEL = "local-llama-8b"
CODEX_MODEL = "gpt-5-codex"
CODEX_WINDOW = 6000
QUESTION: dict[str, Any] = {"role": "user", "content": "Which upstream answers this?"}


@pytest.fixture
async def proxies() -> AsyncIterator[LoopbackProxies]:
    started = LoopbackProxies()
    yield started
    await started.close()


def windows() -> dict[str, int]:
    return {wire.model: AGENTS[wire].window for wire in (CHAT_COMPLETIONS, RESPONSES, MESSAGES)}


def anthropic_sdk(proxy: RunningProxy) -> AsyncAnthropic:
    return AsyncAnthropic(base_url=f"http://127.0.0.1:{proxy.server.port}", api_key="sk-ant-test", max_retries=0)


async def routed(proxy: RunningProxy, upstream: str) -> float:
    """Requests the proxy sent on the route named `upstream`, whatever their kind and status.

    Stops the proxy first: a request is counted as its handler ends, which may be after its client has read the
    answer, and stopping waits for every handler to end.
    """
    await proxy.server.close()
    return sum(
        sample.value
        for metric in proxy.server.app[METRICS].registry.collect()
        if metric.name == "compaction_proxy_upstream_requests"
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels.get("upstream") == upstream
    )


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_one_proxy_serves_the_openai_and_anthropic_sdks_each_from_its_own_provider(
    openai_upstream: OpenAIUpstream,
    anthropic_upstream: AnthropicUpstream,
    proxies: LoopbackProxies,
    stream: bool,
) -> None:
    for wire, fake in (
        (CHAT_COMPLETIONS, openai_upstream),
        (RESPONSES, openai_upstream),
        (MESSAGES, anthropic_upstream),
    ):
        AGENTS[wire].install(fake, summary="")
    openai_upstream.context_windows.update(windows())
    anthropic_upstream.context_window = AGENTS[MESSAGES].window
    proxy = await proxies.start(
        upstream=openai_upstream.base_url, anthropic_upstream=anthropic_upstream.base_url, context_windows=windows()
    )

    decisions = {wire.name: await AGENTS[wire].run(proxy, TURNS, lambda turn: stream) for wire in AGENTS}

    for wire, headers in decisions.items():
        assert len(headers) == TURNS
        assert "compacted" in headers, f"{wire}: the long run was never compacted"
        assert "compacted-after-overflow" not in headers
    # Each provider saw its own API's requests only: every one of them, and nothing else.
    assert {request.path for request in openai_upstream.requests} == {"/v1/chat/completions", "/v1/responses"}
    assert len(MESSAGES.forwarded(anthropic_upstream)) == TURNS
    assert len(CHAT_COMPLETIONS.forwarded(openai_upstream)) == len(RESPONSES.forwarded(openai_upstream)) == TURNS
    assert await routed(proxy, "anthropic") == TURNS
    assert await routed(proxy, "default") == 2 * TURNS


async def test_the_messages_api_s_other_endpoints_follow_it(
    openai_upstream: OpenAIUpstream, anthropic_upstream: AnthropicUpstream, proxies: LoopbackProxies
) -> None:
    proxy = await proxies.start(upstream=openai_upstream.base_url, anthropic_upstream=anthropic_upstream.base_url)
    async with anthropic_sdk(proxy) as client:
        counted = await client.messages.count_tokens(
            model="claude-sonnet-4-5", messages=[{"role": "user", "content": "How many tokens is this?"}]
        )
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0) as client:
        listed = await client.models.list()

    assert counted.input_tokens > 0
    assert len(anthropic_upstream.count_requests) == 1
    assert [model.id for model in listed.data] == openai_upstream.models
    assert not [request for request in openai_upstream.requests if "messages" in request.path]


async def test_a_model_pattern_takes_its_models_to_their_own_upstream(
    openai_upstream: OpenAIUpstream, upstream: OpenAIUpstream, proxies: LoopbackProxies
) -> None:
    local = {"name": "local", "upstream": upstream.base_url, "models": ["local-*"]}
    proxy = await proxies.start(upstream=openai_upstream.base_url, routes=[local])
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0) as client:
        for model in (LOCAL_MODEL, "gpt-4o-mini", LOCAL_MODEL):
            await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])

    assert [body["model"] for body in upstream.chat_requests] == [LOCAL_MODEL, LOCAL_MODEL]
    assert [body["model"] for body in openai_upstream.chat_requests] == ["gpt-4o-mini"]
    assert await routed(proxy, "local") == 2


async def test_codex_s_chatgpt_login_reaches_the_chatgpt_backend_over_its_websocket(
    openai_upstream: OpenAIUpstream, upstream: OpenAIUpstream, proxies: LoopbackProxies
) -> None:
    upstream.context_window = CODEX_WINDOW
    upstream.responses_responder = compacting_responder()
    chatgpt = {"name": "chatgpt", "upstream": upstream.base_url, "header": "ChatGPT-Account-ID"}
    proxy = await proxies.start(
        upstream=openai_upstream.base_url, routes=[chatgpt], context_windows={CODEX_MODEL: CODEX_WINDOW}
    )
    base = f"http://127.0.0.1:{proxy.server.port}/backend-api/codex"
    headers = {"ChatGPT-Account-ID": "account-1", "User-Agent": "python-aiohttp"}
    client = CodexShapedClient(base, CODEX_MODEL, auto_compact_tokens=10**9, headers=headers, websocket=True)
    await client.run(turns=40)

    assert len(client.exchanges) == 40 and all(exchange.status == 200 for exchange in client.exchanges)
    assert client.sockets == 1
    # The run outgrows the window many times over: every answer a 200 means every request was compacted to fit.
    assert {request.path for request in upstream.requests} == {"/backend-api/codex/responses"}
    assert len(upstream.responses_usages) >= 40
    assert not openai_upstream.requests
    assert await routed(proxy, "chatgpt") == 1


async def test_the_console_script_routes_by_flags(
    openai_upstream: OpenAIUpstream, anthropic_upstream: AnthropicUpstream, upstream: OpenAIUpstream
) -> None:
    script = Path(sys.executable).with_name("compaction-proxy")
    local = f"local={upstream.base_url};models={LOCAL_MODEL}"
    command = [str(script), "serve", "--anthropic-upstream", anthropic_upstream.base_url, "--route", local]
    proxy = ProcessProxy(openai_upstream.base_url, command=command, port=0, window_probes=[], count_probes=[])
    async with proxy:
        record = await proxy.wait_for_log(lambda line: line.get("message") == "listening")
        assert list(record["routes"]) == ["local", "anthropic", "default"]
        async with AsyncAnthropic(base_url=proxy.url, api_key="sk-ant-test", max_retries=0) as claude:
            await claude.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=[QUESTION])
        async with openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0) as client:
            for model in ("gpt-4o-mini", LOCAL_MODEL):
                await client.chat.completions.create(model=model, messages=[QUESTION])
    assert len(anthropic_upstream.requests) == 1
    assert [body["model"] for body in openai_upstream.chat_requests] == ["gpt-4o-mini"]
    assert [body["model"] for body in upstream.chat_requests] == [LOCAL_MODEL]
