"""The read tool is never offered where it would collide: a client tool of its name, or a request at the tool limit.

Such a request is pruned instead of offloaded: the upstream sees the client's tools exactly as sent (never a name
twice, never a 129th tool), and every call the model makes, also of the client's own `compaction_proxy_read_result`,
reaches the client.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import orjson
import pytest

from proxy.pipeline.offload.tool import READ_TOOL
from proxy.simulator.openai_common import MAX_TOOLS
from proxy.simulator.openai_upstream import OpenAIUpstream, Reply, ToolCall
from proxy.simulator.responses_api import FunctionCall, ResponsesReply
from tests.e2e.conftest import MODEL, StartProxy
from tests.e2e.test_offload_reads import (
    CLIENT_TOOLS,
    LOG,
    RESPONSES_TOOLS,
    chat_bodies,
    conversation,
    response_items,
    tool_names,
)

OWN_ARGUMENTS = '{"query": "the client\'s own"}'
OWN_PARAMETERS = {"type": "object", "properties": {"query": {"type": "string"}}}


async def declined(base_url: str, reason: str) -> str:
    """The count of requests declined the read tool for `reason`, from `/metrics`."""
    async with aiohttp.ClientSession() as http, http.get(base_url.removesuffix("/v1") + "/metrics") as got:
        lines = (await got.text()).splitlines()
    prefix = f'compaction_proxy_offload_declined_total{{reason="{reason}"}} '
    return next((line.removeprefix(prefix) for line in lines if line.startswith(prefix)), "none")


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_tool_named_like_the_read_tool_reaches_the_client(
    upstream: OpenAIUpstream, start_proxy: StartProxy, stream: bool
) -> None:
    upstream.responder = lambda _request: Reply(tool_calls=(ToolCall("call_own", READ_TOOL, OWN_ARGUMENTS),))
    tools = [*CLIENT_TOOLS, {"type": "function", "function": {"name": READ_TOOL, "parameters": OWN_PARAMETERS}}]
    base_url = await start_proxy()
    async with openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0) as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(
            model=MODEL, messages=conversation(), tools=tools, stream=stream
        )
        if stream:
            deltas = [choice.delta for chunk in [c async for c in raw.parse()] for choice in chunk.choices]
            calls = [call for delta in deltas for call in delta.tool_calls or ()]
            names = [call.function.name for call in calls if call.function and call.function.name]
            got = [(*names, "".join(call.function.arguments or "" for call in calls if call.function))]
        else:
            message = raw.parse().choices[0].message
            got = [(call.function.name, call.function.arguments) for call in message.tool_calls or ()]
    assert got == [(READ_TOOL, OWN_ARGUMENTS)]
    assert raw.headers["x-compaction-strategies"] == "tool_result_pruning"
    assert "x-compaction-offloaded" not in raw.headers
    (body,) = chat_bodies(upstream)
    assert tool_names(body) == ["fetch_log", "check_status", READ_TOOL]
    assert body["tools"][-1]["function"]["parameters"] == OWN_PARAMETERS
    assert await declined(base_url, "name_taken") == "1.0"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_responses_client_tool_named_like_the_read_tool_reaches_the_client(
    upstream: OpenAIUpstream, start_proxy: StartProxy, stream: bool
) -> None:
    upstream.responses_responder = lambda _request: ResponsesReply(
        function_calls=(FunctionCall(READ_TOOL, OWN_ARGUMENTS, call_id="call_own"),)
    )
    tools = [*RESPONSES_TOOLS, {"type": "function", "name": READ_TOOL, "parameters": OWN_PARAMETERS}]
    async with openai.AsyncOpenAI(base_url=await start_proxy(), api_key="k", max_retries=0) as sdk:
        raw = await sdk.responses.with_raw_response.create(
            model=MODEL, input=response_items(), tools=tools, stream=stream
        )
        if stream:
            events = [event async for event in raw.parse()]
            (response,) = [event.response for event in events if event.type == "response.completed"]
        else:
            response = raw.parse()
    calls = [(item.name, item.arguments) for item in response.output if item.type == "function_call"]
    assert calls == [(READ_TOOL, OWN_ARGUMENTS)]
    assert raw.headers["x-compaction-strategies"] == "tool_result_pruning"
    (body,) = upstream.responses_requests
    assert tool_names(body) == ["fetch_log", "check_status", READ_TOOL]


async def test_a_request_at_the_tool_limit_gets_no_more_tools(
    upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    upstream.responder = lambda _request: Reply(content="answered")
    upstream.context_window = 32_768
    tools: list[Any] = [
        {"type": "function", "function": {"name": f"tool_{k}", "parameters": {"type": "object", "properties": {}}}}
        for k in range(MAX_TOOLS - len(CLIENT_TOOLS))
    ]
    base_url = await start_proxy(context_windows={MODEL: 32_768})
    async with openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0) as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(
            model=MODEL, messages=conversation(LOG * 8), tools=[*CLIENT_TOOLS, *tools]
        )
    assert raw.parse().choices[0].message.content == "answered"
    assert raw.headers["x-compaction-strategies"] == "tool_result_pruning"
    (body,) = chat_bodies(upstream)
    assert len(body["tools"]) == MAX_TOOLS
    assert LOG not in orjson.dumps(body).decode()
    assert await declined(base_url, "tool_limit") == "1.0"
