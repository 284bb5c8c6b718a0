"""A client that compacts itself, through the real proxy: deferred to, and rescued only when it would not fit.

A Codex-shaped client (`tests.support.codex_client`) compacts its own history at 0.9 of the window; the proxy's
trigger is at 0.7. Recognized, its requests are forwarded as sent and its own compaction keeps it inside the window;
its compaction request, when that would overflow, is the one the proxy compacts. Unrecognized, it is compacted at
`compact_at` as any client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.support.codex_client import CODEX_HEADERS, CodexShapedClient, compacting_responder
from tests.support.proxies import LoopbackProxies

MODEL = "gpt-4.1"
WINDOW = 8000
AUTO_COMPACT = int(0.9 * WINDOW)
DEFERRED_METRIC = "compaction_proxy_client_compaction_requests_total"
TOOLS: list[Any] = [{"type": "function", "name": "read_file", "parameters": {"type": "object", "properties": {}}}]


@pytest.fixture
async def upstream() -> AsyncIterator[OpenAIUpstream]:
    async with OpenAIUpstream(context_window=WINDOW, responses_responder=compacting_responder()) as fake:
        yield fake


@pytest.fixture
async def proxies(upstream: OpenAIUpstream) -> AsyncIterator[LoopbackProxies]:
    started = LoopbackProxies(upstream=upstream.base_url, context_windows={MODEL: WINDOW})
    yield started
    await started.close()


async def test_a_codex_client_is_forwarded_unchanged_while_its_own_compaction_keeps_it_inside_the_window(
    upstream: OpenAIUpstream, proxies: LoopbackProxies
) -> None:
    proxy = await proxies.start()
    client = CodexShapedClient(proxy.url, MODEL, AUTO_COMPACT)
    await client.run(turns=45)

    assert [exchange.status for exchange in client.exchanges] == [200] * len(client.exchanges)
    assert upstream.responses_requests == [exchange.body for exchange in client.exchanges], "forwarded as sent"
    own = [exchange for exchange in client.exchanges if exchange.compaction]
    assert len(own) >= 2, "the client compacted itself, more than once"
    assert all(exchange.headers["X-Compaction-Deferred"] == "compaction-request" for exchange in own)
    regular = [exchange for exchange in client.exchanges if not exchange.compaction]
    assert {exchange.headers["X-Compaction-Deferred"] for exchange in regular} == {"codex-cli"}
    assert {exchange.headers["X-Compaction"] for exchange in client.exchanges} == {"deferred"}
    above_trigger = [e for e in regular if int(e.headers["X-Compaction-Tokens-Before"]) >= 0.7 * WINDOW]
    assert len(above_trigger) >= 4, "the proxy's own trigger was passed, and it held back"
    assert max(usage["input_tokens"] for usage in upstream.responses_usages) < WINDOW


async def test_a_codex_compaction_request_that_would_overflow_is_the_one_the_proxy_compacts(
    upstream: OpenAIUpstream, proxies: LoopbackProxies
) -> None:
    proxy = await proxies.start()
    # The command run when the limit is reached prints a lot: the compaction request then exceeds the window.
    client = CodexShapedClient(
        proxy.url, MODEL, AUTO_COMPACT, output_words=lambda used: 1400 if used >= AUTO_COMPACT else 300
    )
    await client.run(turns=30)

    assert [exchange.status for exchange in client.exchanges] == [200] * len(client.exchanges)
    own = [index for index, exchange in enumerate(client.exchanges) if exchange.compaction]
    assert own, "the client compacted itself"
    rescued = client.exchanges[own[0]]
    assert int(rescued.headers["X-Compaction-Tokens-Before"]) >= WINDOW, "it would not have fit"
    assert rescued.headers["X-Compaction"] == "compacted"
    assert rescued.headers["X-Compaction-Deferred"] == "compaction-request"
    assert int(rescued.headers["X-Compaction-Tokens-After"]) < WINDOW
    forwarded = upstream.responses_requests
    assert forwarded[own[0]] != rescued.body
    assert forwarded[own[0]]["input"][-1] == rescued.body["input"][-1], "the compact prompt is still asked"
    others = [index for index in range(len(client.exchanges)) if index != own[0]]
    assert [forwarded[index] for index in others] == [client.exchanges[index].body for index in others]
    assert {client.exchanges[index].headers["X-Compaction"] for index in others} == {"deferred"}


async def test_the_same_conversation_without_the_signals_is_compacted_at_compact_at(
    upstream: OpenAIUpstream, proxies: LoopbackProxies
) -> None:
    proxy = await proxies.start()
    client = CodexShapedClient(proxy.url, MODEL, AUTO_COMPACT, headers={"User-Agent": "python-aiohttp"})
    await client.run(turns=30)

    assert [exchange.status for exchange in client.exchanges] == [200] * len(client.exchanges)
    compacted = [exchange for exchange in client.exchanges if exchange.headers["X-Compaction"] == "compacted"]
    assert compacted, "the proxy compacted"
    first = int(compacted[0].headers["X-Compaction-Tokens-Before"])
    assert 0.7 * WINDOW <= first < AUTO_COMPACT, "at its own trigger, before the client's"
    assert not any("X-Compaction-Deferred" in exchange.headers for exchange in client.exchanges)
    assert upstream.responses_requests != [exchange.body for exchange in client.exchanges]


def history(steps: int, output_words: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "user", "content": "Read the files and report."}]
    for step in range(steps):
        items.append({"type": "function_call", "call_id": f"c{step}", "name": "read_file", "arguments": "{}"})
        items.append({"type": "function_call_output", "call_id": f"c{step}", "output": "word " * output_words})
    return items


async def post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/responses", json=body, headers={"Authorization": "Bearer sk-a", **headers}) as r,
    ):
        await r.read()
        return r.status, dict(r.headers)


@pytest.mark.parametrize(
    ("settings", "headers", "fields", "outcome"),
    [
        ({}, {}, {}, ("compacted", None)),
        ({}, CODEX_HEADERS, {}, ("deferred", "codex-cli")),
        ({}, {"User-Agent": "claude-cli/2.0.14 (external, cli)", "x-app": "cli"}, {}, ("deferred", "claude-code")),
        ({}, {"originator": "codex_exec"}, {}, ("deferred", "codex-cli")),
        ({}, {**CODEX_HEADERS, "X-Compaction-Client": "ignore"}, {}, ("compacted", None)),
        ({}, {"X-Compaction-Client": "defer"}, {}, ("deferred", "header")),
        ({}, {"X-Compaction-Client": "sometimes"}, {}, ("compacted", None)),
        ({"client_compaction": "defer"}, {}, {}, ("deferred", "setting")),
        ({"client_compaction": "ignore"}, CODEX_HEADERS, {}, ("compacted", None)),
        (
            {"client_compaction": "ignore"},
            {"X-Compaction-Client": "auto", **CODEX_HEADERS},
            {},
            ("deferred", "codex-cli"),
        ),
        ({}, {}, {"truncation": "auto"}, ("deferred", "context-management")),
    ],
)
async def test_who_is_deferred_to_is_what_the_signals_setting_and_header_say(
    proxies: LoopbackProxies,
    settings: dict[str, Any],
    headers: dict[str, str],
    fields: dict[str, Any],
    outcome: tuple[str, str | None],
) -> None:
    proxy = await proxies.start(**settings)
    body = {"model": MODEL, "input": history(steps=6, output_words=1000), "tools": TOOLS, "store": False, **fields}
    status, answered = await post(proxy.url, body, headers)
    assert status == 200
    assert 0.7 * WINDOW <= int(answered["X-Compaction-Tokens-Before"]) < WINDOW
    expected, signal = outcome
    assert answered["X-Compaction"] == expected
    assert answered.get("X-Compaction-Deferred") == signal
    if headers.get("X-Compaction-Client") == "sometimes":
        assert answered["X-Compaction-Warning"] == "X-Compaction-Client ignored: not auto, defer or ignore"
    async with aiohttp.ClientSession() as session, session.get(proxy.url.removesuffix("/v1") + "/metrics") as r:
        counted = [line for line in (await r.text()).splitlines() if line.startswith(DEFERRED_METRIC)]
    assert counted == ([f'{DEFERRED_METRIC}{{signal="{signal}"}} 1.0'] if signal else [])


async def test_a_carried_compaction_item_is_a_signal_and_over_the_window_the_safety_net_compacts(
    upstream: OpenAIUpstream, proxies: LoopbackProxies
) -> None:
    proxy = await proxies.start()
    story: list[dict[str, Any]] = [{"role": "user", "content": "story " * 1500}]
    management = [{"type": "compaction", "compact_threshold": 500}]
    direct = {"model": MODEL, "input": story, "store": False, "context_management": management}
    async with aiohttp.ClientSession() as session, session.post(upstream.base_url + "/v1/responses", json=direct) as r:
        carried = (await r.json())["output"]
    assert carried[0]["type"] == "compaction"
    body = {"model": MODEL, "input": [*carried, *history(steps=6, output_words=1000)], "store": False}
    status, answered = await post(proxy.url, body, {})
    assert (status, answered["X-Compaction"], answered["X-Compaction-Deferred"]) == (
        200,
        "deferred",
        "compaction-items",
    )
    # Over the window, what the carried item stands for goes first, losing nothing.
    over = {**body, "input": [*story, *carried, *history(steps=7, output_words=1000)]}
    status, answered = await post(proxy.url, over, {})
    assert int(answered["X-Compaction-Tokens-Before"]) >= WINDOW
    assert answered["X-Compaction-Strategies"].startswith("provider_compaction")
    assert (status, answered["X-Compaction"], answered["X-Compaction-Deferred"]) == (
        200,
        "compacted",
        "compaction-items",
    )


@pytest.mark.parametrize(
    ("user_agent", "expected"), [("claude-cli/2.0.14 (external, cli)", "deferred"), ("", "compacted")]
)
async def test_a_chat_completion_of_claude_code_is_deferred_to(
    upstream: OpenAIUpstream, proxies: LoopbackProxies, user_agent: str, expected: str
) -> None:
    proxy = await proxies.start()
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are Claude Code."}]
    for turn in range(6):
        messages += [
            {"role": "user", "content": f"part {turn}: " + "word " * 1000},
            {"role": "assistant", "content": "ok"},
        ]
    messages.append({"role": "user", "content": "Summarize the parts."})
    body = {"model": MODEL, "messages": messages}
    headers = {"Authorization": "Bearer sk-a", "User-Agent": user_agent or "python-aiohttp"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(proxy.url + "/chat/completions", json=body, headers=headers) as r,
    ):
        assert r.status == 200
        answered = r.headers
    assert 0.7 * WINDOW <= int(answered["X-Compaction-Tokens-Before"]) < WINDOW
    assert answered["X-Compaction"] == expected
    assert (upstream.chat_requests[-1] == body) == (expected == "deferred")


async def test_a_deferred_request_the_upstream_refuses_is_compacted_and_retried(
    upstream: OpenAIUpstream, proxies: LoopbackProxies
) -> None:
    upstream.context_window = 5000  # the proxy believes the model has 8,000 tokens
    proxy = await proxies.start()
    body = {"model": MODEL, "input": history(steps=6, output_words=1000), "tools": TOOLS, "store": False}
    status, answered = await post(proxy.url, body, CODEX_HEADERS)
    assert status == 200
    assert (answered["X-Compaction"], answered["X-Compaction-Deferred"]) == ("compacted-after-overflow", "codex-cli")
    refused, retried = upstream.responses_requests
    assert refused == body, "first forwarded as sent"
    assert retried != body
