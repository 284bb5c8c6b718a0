"""The Responses API through the real proxy with the official SDK, against an upstream as strict as OpenAI's.

An agent on `client.responses.create` (function tools, `store=False`, reasoning carried forward as
`encrypted_content`) that overflows a 32k window going direct runs 200 turns through the proxy: no error, no
upstream rejection, the forwarded prefix stable between compactions, and most input tokens served from the
provider's prompt cache.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from tests.support.openai_upstream import OpenAIUpstream
from tests.support.proxies import LoopbackProxies
from tests.support.responses_api import responses_tool_loop_responder

MODEL = "gpt-4.1"
WINDOW = 32_000
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    }
]
FILE_TEXT = "def handler(event, context):\n    return process(event['records'], retries=3)\n"


@pytest.fixture
async def upstream() -> AsyncIterator[OpenAIUpstream]:
    responder = responses_tool_loop_responder("read_file", steps=20, arguments=lambda step, _k: {"path": f"f{step}"})
    async with OpenAIUpstream(context_window=WINDOW, responses_responder=responder) as fake:
        yield fake


@pytest.fixture
async def proxies(upstream: OpenAIUpstream) -> AsyncIterator[LoopbackProxies]:
    started = LoopbackProxies(upstream=upstream.base_url, context_windows={MODEL: WINDOW})
    yield started
    await started.close()


async def respond(client: openai.AsyncOpenAI, items: list[dict[str, Any]], *, stream: bool) -> tuple[Any, str]:
    """One model call; returns the response and the proxy's `X-Compaction` header (empty going direct).

    The items go as they are, in `extra_body`: the SDK's own pass over a typed `input` costs more per item than
    everything else here together, and a 200-turn history holds 700 of them.
    """
    raw = await client.responses.with_raw_response.create(
        model=MODEL,
        instructions="You are a meticulous code reviewer.",
        extra_body={"input": items},
        tools=TOOLS,
        store=False,
        include=["reasoning.encrypted_content"],
        stream=stream,
    )
    header = raw.headers.get("x-compaction", "")
    if not stream:
        return raw.parse(), header
    completed = None
    async for event in raw.parse():
        if event.type == "response.completed":
            completed = event.response
    assert completed is not None, "the stream ended without response.completed"
    return completed, header


async def run_agent(client: openai.AsyncOpenAI, turns: int, *, stream: bool) -> list[str]:
    """Tasks of tool calls, the whole history kept client-side as SDK users do, until `turns` model calls."""
    items: list[dict[str, Any]] = []
    headers: list[str] = []
    task = 0
    while len(headers) < turns:
        items.append({"role": "user", "content": f"Task {task}: review module {task} and report what it does."})
        task += 1
        while len(headers) < turns:
            response, header = await respond(client, items, stream=stream)
            headers.append(header)
            output = [item.model_dump(exclude_none=True) for item in response.output]
            items.extend(output)
            calls = [item for item in output if item["type"] == "function_call"]
            if not calls:
                break
            for call in calls:
                path = json.loads(call["arguments"])["path"]
                items.append(
                    {"type": "function_call_output", "call_id": call["call_id"], "output": path + FILE_TEXT * 12}
                )
    return headers


async def test_the_agent_overflows_going_direct(upstream: OpenAIUpstream) -> None:
    async with openai.AsyncOpenAI(base_url=upstream.base_url + "/v1", api_key="sk-test", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as raised:
            await run_agent(client, 200, stream=False)
    assert raised.value.code == "context_length_exceeded"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_200_turns_through_the_proxy_fit_and_keep_the_cache_hitting(
    upstream: OpenAIUpstream, proxies: LoopbackProxies, stream: bool
) -> None:
    proxy = await proxies.start()
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0) as client:
        headers = await run_agent(client, 200, stream=stream)

    forwarded = upstream.responses_requests
    assert len(forwarded) == len(headers) == 200
    compactions = headers.count("compacted")
    assert 1 <= compactions <= 20, headers
    assert "compacted-after-overflow" not in headers
    for previous, current, header in zip(forwarded, forwarded[1:], headers[1:], strict=False):
        if header != "compacted":
            assert current["input"][: len(previous["input"])] == previous["input"], "the forwarded prefix changed"
    usages = upstream.responses_usages
    assert len(usages) == 200
    assert max(usage["input_tokens"] for usage in usages) < WINDOW
    cached = sum(usage["input_tokens_details"]["cached_tokens"] for usage in usages)
    total = sum(usage["input_tokens"] for usage in usages)
    print(f"\nresponses agent ({'sse' if stream else 'json'}): {compactions} compactions, {cached / total:.1%} cached")
    assert cached >= 0.8 * total
