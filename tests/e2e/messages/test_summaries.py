"""Summaries for Messages conversations on a model that binds thinking to its prefix: the summary call drops it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from proxy.formats.anthropic.rules import without_cache_control
from proxy.pipeline.summary_text import IN_CONTEXT_PREAMBLE
from tests.e2e.messages.conftest import BINDING, WINDOW, sdk
from tests.support.anthropic_agent import TOOLS, run_agent
from tests.support.anthropic_upstream import AnthropicUpstream, tool_loop_responder
from tests.support.proxies import LoopbackProxies

SUMMARY_MARK = IN_CONTEXT_PREAMBLE.split(":", 1)[0]
SUMMARY = "## Objective\n- review the modules\n## Work done\n- searched for tasks 1 to 20\n"


def is_summary_request(body: Mapping[str, Any]) -> bool:
    content = body["messages"][-1]["content"]
    return isinstance(content, str) and content.startswith(SUMMARY_MARK)


async def test_summaries_on_a_model_that_binds_thinking_drop_it_and_replace_their_span(
    upstream: AnthropicUpstream,
) -> None:
    """The case every format shares (a model that binds nothing) is in `tests/e2e/test_summaries.py`."""
    model = BINDING
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
        assert "thinking" not in str([m["content"] for m in summary["messages"] if m["role"] == "assistant"])
    assert any("searched for tasks 1 to 20" in str(body["messages"]) for body in forwarded), "no summary was used"
