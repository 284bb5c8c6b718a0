"""Summaries in the proxy: once per span, from the forwarded prefix, for every format; and for chat completions,
written ahead, with every failure falling back.

The Messages API's own case (a model that binds thinking to its prefix) is in `tests/e2e/messages/test_summaries.py`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.pipeline.offload.tool import READ_TOOL
from proxy.pipeline.summary_text import IN_CONTEXT_PREAMBLE
from proxy.simulator.openai_upstream import OpenAIUpstream, Reply
from tests.e2e.conftest import MODEL, WINDOW
from tests.support.format_agents import AGENTS
from tests.support.format_agents import is_summary_request as is_summary_call
from tests.support.proxies import LoopbackProxies, RunningProxy
from tests.support.wire_formats import FormatCase, Upstream, by_format

SUMMARY_MARK = IN_CONTEXT_PREAMBLE.split(":", 1)[0]
CARRIED = ("authorization", "x-api-key", "anthropic-version")
PER_CALL = {"messages", "input", "tools", "tool_choice", "stream", "stream_options", "include"}
"""The fields a summary call sets itself (`include` asks for what a summary does not need)."""
SUMMARY = "## Objective\n- review the handlers\n## Decisions and constraints\n(none)\n## Work done\n- read files\n"


def is_summary_request(body: dict[str, Any]) -> bool:
    last = body["messages"][-1]
    return last["role"] == "user" and str(last.get("content", "")).startswith(SUMMARY_MARK)


def summarizing(responder: Callable[[dict[str, Any]], Reply], summary: str = SUMMARY) -> Callable[..., Reply]:
    def respond(request: dict[str, Any]) -> Reply:
        return Reply(content=summary) if is_summary_request(request) else responder(request)

    return respond


async def settled(proxy: RunningProxy) -> None:
    """Wait for the summaries the proxy is writing in the background."""
    pending = proxy.service.summaries.pending() if proxy.service.summaries else []
    await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), timeout=30)


@pytest.fixture
async def proxy_for(upstream: OpenAIUpstream) -> AsyncIterator[Callable[..., Any]]:
    proxies = LoopbackProxies(
        upstream=upstream.base_url,
        context_windows={MODEL: WINDOW},
        strategies=["summarization", "sliding_window", "middle_out"],
    )
    yield proxies.start
    await proxies.close()


@by_format()
async def test_a_long_run_summarizes_each_span_once_from_the_forwarded_prefix(
    wire: FormatCase, format_upstream: Upstream, format_proxies: LoopbackProxies
) -> None:
    agent = AGENTS[wire]
    agent.install(format_upstream, SUMMARY)
    format_upstream.context_window = agent.window
    strategies = ["summarization", "sliding_window", "middle_out"]
    proxy = await format_proxies.start(context_windows={wire.model: agent.window}, strategies=strategies)
    decisions = await agent.run(proxy, 120, lambda turn: turn % 2 == 1)
    await settled(proxy)

    raws = wire.forwarded(format_upstream)
    summaries = [raw for raw in raws if is_summary_call(wire, orjson.loads(raw))]
    forwarded = [raw for raw in raws if raw not in summaries]
    assert len(forwarded) == len(decisions) and "compacted" in decisions
    assert summaries, "the run never needed a summary"
    assert proxy.service.metrics.summaries_used._value.get() >= 1
    assert proxy.service.metrics.summary_fallbacks.labels("upstream_error")._value.get() == 0, "a call was refused"
    # Every call, the summary calls too, carries the client's credentials and API version.
    carried = {tuple(sent.get(name) for name in CARRIED) for sent in wire.forwarded_headers(format_upstream)}
    assert len(carried) == 1 and any(carried.pop()), "a call without the client's credentials or API version"
    covered = []
    for raw in summaries:
        summary = orjson.loads(raw)
        # The summary call is a forwarded prompt plus one instruction at the end: byte for byte where the client
        # moves no cache breakpoints, entry for entry (breakpoints aside) where it does.
        asked = wire.comparable_entries(summary[wire.entries][:-1])
        extended = [sent for sent in forwarded if wire.comparable_entries(orjson.loads(sent)[wire.entries]) == asked]
        assert extended, "not a forwarded prompt plus one"
        if not wire.moving_breakpoints:
            array = wire.entries_bytes(raw)
            assert any(array.startswith(wire.entries_bytes(sent)[:-1] + b",") for sent in extended)
        # The tools of the request it extends (the client's, and the read tool if it was offered), offered to none.
        tools = orjson.loads(extended[-1])["tools"]
        assert summary["tools"] == tools and [tool for tool in tools if READ_TOOL not in str(tool)] == agent.tools
        assert summary["tool_choice"] == wire.no_tools and "stream" not in summary
        # Everything else as the request it extends had it (model, instructions or system prompt, `store`, ...).
        same = {key: value for key, value in summary.items() if key not in PER_CALL}
        assert same == {key: value for key, value in orjson.loads(extended[-1]).items() if key not in PER_CALL}
        positions = span_positions(summary[wire.entries][-1]["content"])
        entries = summary[wire.entries]
        covered.append(json.dumps([entries[position - 1] for position in positions], sort_keys=True))
    # No stretch of the conversation was summarized twice: the rewrite memory replays each summary instead.
    assert len(covered) == len(set(covered))
    carrying = [raw for raw in forwarded if "review the handlers" in str(orjson.loads(raw)[wire.entries])]
    assert carrying, "no request carried the summary"


def span_positions(instruction: str) -> list[int]:
    """The 1-based message positions an instruction names, e.g. `Messages 2-9, 12 above`."""
    text = instruction.split("Messages ", 1)[1].split(" above", 1)[0]
    positions: list[int] = []
    for run in text.split(", "):
        first, _, last = run.partition("-")
        positions.extend(range(int(first), int(last or first) + 1))
    return positions


async def test_summary_written_ahead_costs_no_round_trip_when_compaction_is_due(
    upstream: OpenAIUpstream, proxy_for: Callable[..., Any]
) -> None:
    upstream.responder = summarizing(lambda _request: Reply(content="Noted."))
    proxy = await proxy_for(precompact_at=0.5)
    turns: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    paragraph = "The deploy failed because the migration locked the orders table for eleven minutes. "

    async def send(session: aiohttp.ClientSession) -> dict[str, str]:
        body = json.dumps({"model": MODEL, "messages": turns}).encode()
        async with session.post(f"{proxy.url}/chat/completions", data=body, headers={"Authorization": "Bearer k"}) as r:
            assert r.status == 200
            answer = await r.json()
            turns.append(answer["choices"][0]["message"])
            return dict(r.headers)

    async with aiohttp.ClientSession() as session:
        # Grow the conversation until a summary has been started ahead of time, without compaction being due yet.
        while proxy.service.metrics.summaries_started._value.get() == 0:
            turns.append({"role": "user", "content": paragraph * 6})
            headers = await send(session)
            assert headers["X-Compaction"] == "unchanged"
        await settled(proxy)
        # Now grow it past the trigger: the compaction uses the finished summary, with no call of its own.
        while True:
            turns.append({"role": "user", "content": paragraph * 6})
            before = len(upstream.requests)
            headers = await send(session)
            if headers["X-Compaction"] != "unchanged":
                break
        assert headers["X-Compaction"] == "compacted"
        assert headers["X-Compaction-Strategies"].startswith("summarization")
        assert len(upstream.requests) == before + 1, "the triggering request waited for a summary call"
        assert SUMMARY_MARK not in json.dumps(upstream.requests[-1].json)
        assert "<conversation_summary>" in json.dumps(upstream.requests[-1].json)


@pytest.mark.parametrize(
    ("fault", "reason"),
    [("slow", "not_ready"), ("failing", "upstream_error"), ("useless", "not_smaller")],
)
async def test_bad_summaries_fall_back_and_the_request_is_answered(
    upstream: OpenAIUpstream, proxy_for: Callable[..., Any], fault: str, reason: str
) -> None:
    summary = "word " * 20_000 if fault == "useless" else SUMMARY
    upstream.responder = summarizing(lambda _request: Reply(content="Noted."), summary)
    proxy = await proxy_for(summary_wait_seconds=0.5)
    if fault == "slow":
        upstream.fail_next(status=500, delay=3.0)
    elif fault == "failing":
        upstream.fail_next(status=500)
    paragraph = "The deploy failed because the migration locked the orders table for eleven minutes. "
    messages = [{"role": "system", "content": "You are terse."}]
    for turn in range(32):  # about 3,500 tokens: over the trigger of a 4k window
        messages.append({"role": "user", "content": f"{turn}: " + paragraph * 6})
        messages.append({"role": "assistant", "content": "Noted."})
    messages.append({"role": "user", "content": "What went wrong?"})
    body = json.dumps({"model": MODEL, "messages": messages}).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{proxy.url}/chat/completions", data=body, headers={"Authorization": "Bearer k"}) as response,
    ):
        assert response.status == 200
        assert response.headers["X-Compaction"] == "compacted"
        assert response.headers["X-Compaction-Strategies"] == "sliding_window"
    assert proxy.service.metrics.summary_fallbacks.labels(reason)._value.get() == 1
    await settled(proxy)
