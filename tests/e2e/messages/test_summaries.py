"""Summaries for Messages conversations: a `/v1/messages` call made of the forwarded messages plus one instruction."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from proxy.formats.anthropic.rules import without_cache_control
from proxy.pipeline.summary_text import IN_CONTEXT_PREAMBLE
from tests.e2e.messages.conftest import BINDING, NON_BINDING, WINDOW, sdk
from tests.support.anthropic_agent import TOOLS, run_agent
from tests.support.anthropic_upstream import AnthropicUpstream, tool_loop_responder
from tests.support.proxies import LoopbackProxies

SUMMARY_MARK = IN_CONTEXT_PREAMBLE.split(":", 1)[0]
SUMMARY = "## Objective\n- review the modules\n## Work done\n- searched for tasks 1 to 20\n"


def is_summary_request(body: Mapping[str, Any]) -> bool:
    content = body["messages"][-1]["content"]
    return isinstance(content, str) and content.startswith(SUMMARY_MARK)


@pytest.mark.parametrize("model", [NON_BINDING, BINDING])
async def test_summaries_are_written_from_the_forwarded_messages_and_replace_their_span(
    upstream: AnthropicUpstream, model: str
) -> None:
    agent = tool_loop_responder("search", steps=2, words=60)
    upstream.responder = lambda body: [{"type": "text", "text": SUMMARY}] if is_summary_request(body) else agent(body)
    proxies = LoopbackProxies(
        upstream=upstream.base_url,
        context_windows={"claude": WINDOW},
        strategies=["summarization", "sliding_window", "middle_out"],
    )
    try:
        proxy = await proxies.start()
        async with sdk(proxy) as client:
            run = await run_agent(client, model, 120, lambda turn: turn % 2 == 1)
        pending = proxy.service.summaries.pending() if proxy.service.summaries else []
        await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), timeout=30)
        used = proxy.service.metrics.summaries_used._value.get()
    finally:
        await proxies.close()

    assert upstream.rejections == []
    summaries = [body for body in upstream.requests if is_summary_request(body)]
    forwarded = [without_cache_control(body) for body in upstream.requests if not is_summary_request(body)]
    assert len(forwarded) == len(run.decisions) and "compacted" in run.decisions
    assert summaries and used >= 1
    assert all(headers.get("anthropic-version") for headers in upstream.headers), "a call without the API version"
    for summary in summaries:
        assert summary["tools"][: len(TOOLS)] == TOOLS and summary["tool_choice"] == {"type": "none"}
        assert "stream" not in summary
        if model == NON_BINDING:
            # The call is a forwarded request's messages, message for message, plus one instruction.
            asked = without_cache_control(summary["messages"][:-1])
            assert any(sent["messages"] == asked for sent in forwarded), "not forwarded messages plus one"
        else:
            assert "thinking" not in str([m["content"] for m in summary["messages"] if m["role"] == "assistant"])
    assert any("searched for tasks 1 to 20" in str(body["messages"]) for body in forwarded), "no summary was used"
