"""Summaries for Responses conversations: a `/v1/responses` call made of the forwarded input plus one instruction."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from proxy.pipeline.summary_text import IN_CONTEXT_PREAMBLE
from tests.e2e.test_responses import MODEL, TOOLS, run_agent
from tests.support.openai_upstream import OpenAIUpstream
from tests.support.proxies import LoopbackProxies
from tests.support.responses_api import ResponsesReply, responses_tool_loop_responder

SUMMARY_MARK = IN_CONTEXT_PREAMBLE.split(":", 1)[0]
SUMMARY = "## Objective\n- review the modules\n## Work done\n- read files f1 to f20\n"


def is_summary_request(body: dict[str, Any]) -> bool:
    last = body["input"][-1]
    return last.get("role") == "user" and str(last.get("content", "")).startswith(SUMMARY_MARK)


@pytest.fixture
async def upstream() -> AsyncIterator[OpenAIUpstream]:
    agent = responses_tool_loop_responder("read_file", steps=20, arguments=lambda step, _k: {"path": f"f{step}"})

    def respond(request: dict[str, Any]) -> ResponsesReply:
        return ResponsesReply(text=SUMMARY) if is_summary_request(request) else agent(request)

    async with OpenAIUpstream(context_window=32_000, responses_responder=respond) as fake:
        yield fake


async def test_summaries_are_written_from_the_forwarded_input_and_replace_their_span(upstream: OpenAIUpstream) -> None:
    proxies = LoopbackProxies(
        upstream=upstream.base_url,
        context_windows={MODEL: 16_000},
        strategies=["summarization", "sliding_window", "middle_out"],
    )
    try:
        proxy = await proxies.start()
        async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0) as client:
            headers = await run_agent(client, 60, stream=False)
        pending = proxy.service.summaries.pending() if proxy.service.summaries else []
        await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), timeout=30)
        used = proxy.service.metrics.summaries_used._value.get()
    finally:
        await proxies.close()

    requests = upstream.responses_requests
    summaries = [body for body in requests if is_summary_request(body)]
    forwarded = [body for body in requests if not is_summary_request(body)]
    assert len(forwarded) == len(headers) and "compacted" in headers
    assert summaries and used >= 1
    for summary in summaries:
        # The summary call is a forwarded input, item for item, plus one instruction; tools off, nothing stored.
        assert any(sent["input"] == summary["input"][:-1] for sent in forwarded), "not a forwarded input plus one"
        assert summary["tools"] == TOOLS and summary["tool_choice"] == "none" and summary["store"] is False
        assert summary["instructions"] == forwarded[0]["instructions"]
    assert any("read files f1 to f20" in str(body["input"]) for body in forwarded), "no request carried the summary"
