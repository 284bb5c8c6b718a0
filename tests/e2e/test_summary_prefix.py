"""A summary call repeats, byte for byte, the prompt the proxy forwarded just before it, so the cache serves it.

The provider's prompt cache serves the longest prefix a prompt shares with an earlier one, and tools come first in
that prefix: a summary call that differs from the forwarded request in one byte of its tools, or of any message before
its instruction, is served from the cache only up to that byte. Both APIs are run through the real proxy with tool
results large enough to be offloaded, so forwarded requests carry the proxy's read tool before summaries are
written, and every summary call is compared with the forwarded request next to it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import openai
import pytest

from proxy.pipeline.offload.tool import READ_TOOL
from proxy.pipeline.summary_text import IN_CONTEXT_PREAMBLE
from proxy.simulator.openai_tokens import CACHE_BLOCK_TOKENS, prompt_token_sequence
from proxy.simulator.openai_upstream import OpenAIUpstream
from proxy.simulator.responses_api import ResponsesReply, responses_tool_loop_responder
from tests.e2e.conftest import MODEL
from tests.e2e.test_summaries import SUMMARY, settled
from tests.support import responses_agent
from tests.support.agent_run import TOOLS, agent_responder, run_agent
from tests.support.proxies import LoopbackProxies, RunningProxy

SUMMARY_MARK = IN_CONTEXT_PREAMBLE.split(":", 1)[0]
STRATEGIES = ["summarization", "sliding_window", "middle_out"]

Body = dict[str, Any]


def serialized(value: Any) -> str:
    """The bytes a field is rendered from, in the order it was sent: compact JSON, keys in their own order."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def instruction_of(body: Body, key: str) -> str | None:
    """The text of a summary call's last message or item (its instruction), None for any other request."""
    entries = body.get(key)
    last = entries[-1] if isinstance(entries, list) and entries else None
    content = last.get("content") if isinstance(last, dict) and last.get("role") == "user" else None
    return content if isinstance(content, str) and content.startswith(SUMMARY_MARK) else None


def check_summary_prefixes(bodies: list[Body], key: str, head: tuple[str, ...]) -> int:
    """Assert every summary call among `bodies` is the forwarded request next to it plus one instruction.

    The forwarded request a summary call repeats is the one its turn's usage anchor covers, answered before the call
    went out: the last forwarded before it when the summary is written on the turn that compacts, the one before
    that when it is written ahead beside its turn's request (the client waits for each turn's summaries, so nothing
    else comes between). Its `head` fields and its `key` entries (messages or input items), serialized, are those of
    the summary call before its instruction.

    :returns: How many summary calls were compared.
    """
    summaries = 0
    for index, body in enumerate(bodies):
        if instruction_of(body, key) is None:
            continue
        summaries += 1
        prefix = [serialized(entry) for entry in body[key][:-1]]
        earlier = [sent for sent in bodies[:index] if instruction_of(sent, key) is None][-2:]
        repeated = [sent for sent in earlier if prefix == [serialized(e) for e in sent[key]]]
        assert repeated, f"summary call {index} repeats neither of the last two forwarded requests before it"
        sent = repeated[0]
        for field in head:
            assert serialized(body.get(field)) == serialized(sent.get(field)), f"summary call {index}: {field} differ"
        order = [name for name in body if name in (*head, key)]
        assert order == [name for name in sent if name in (*head, key)], f"summary call {index}: fields reordered"
        assert body["tool_choice"] == "none"
    return summaries


def read_tool_in(body: Body) -> bool:
    """Whether a request offers the proxy's read tool (in either API's shape)."""
    return any(READ_TOOL in (tool.get("name"), (tool.get("function") or {}).get("name")) for tool in body["tools"])


def settling(proxy: RunningProxy) -> httpx.AsyncClient:
    """An HTTP client that waits, on each answer, for the summaries its request started, so turns never overlap them."""

    async def wait(_response: httpx.Response) -> None:
        await settled(proxy)

    return httpx.AsyncClient(event_hooks={"response": [wait]})


@pytest.fixture
async def proxies(upstream: OpenAIUpstream) -> AsyncIterator[Callable[..., Any]]:
    started = LoopbackProxies(upstream=upstream.base_url, strategies=STRATEGIES)
    yield started.start
    await started.close()


async def settled_chat_agent(proxy: RunningProxy, tasks: int, result_lines: int) -> None:
    """The chat agent through the official SDK, `tasks` tasks of 20 steps, each turn sent once the proxy is settled."""
    async with (
        settling(proxy) as http,
        openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0, http_client=http) as client,
    ):

        async def turn(messages: list[Body]) -> tuple[Body, str]:
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=messages,  # type: ignore[arg-type]
                tools=TOOLS,  # type: ignore[arg-type]
            )
            return raw.parse().choices[0].message.model_dump(exclude_none=True), raw.headers.get("x-compaction", "")

        await run_agent(turn, tasks=tasks, steps=20, result_lines=result_lines)


async def test_chat_summary_calls_repeat_the_forwarded_prompt_tools_included(
    upstream: OpenAIUpstream, proxies: Callable[..., Any]
) -> None:
    upstream.responder = agent_responder()
    proxy = await proxies(context_windows={MODEL: 4096})
    await settled_chat_agent(proxy, tasks=4, result_lines=18)

    bodies = [request.json for request in upstream.requests if request.path.endswith("/chat/completions")]
    assert check_summary_prefixes(bodies, "messages", ("model", "tools")) >= 2
    summaries = [body for body in bodies if instruction_of(body, "messages") is not None]
    assert any(read_tool_in(body) for body in summaries), "no summary followed an offloaded result"
    for body, usage in zip(bodies, upstream.usages, strict=True):
        if instruction_of(body, "messages") is not None:
            served = usage["prompt_tokens_details"]["cached_tokens"]
            assert served == full_blocks_before_instruction(body), "the cache did not serve all the summary repeats"


def full_blocks_before_instruction(body: Body) -> int:
    """The tokens of a chat summary call before its instruction, in the whole 128-token blocks a cache can serve."""
    before = prompt_token_sequence({**body, "messages": body["messages"][:-1]})
    priming = prompt_token_sequence({"model": body["model"], "messages": []})
    return (len(before) - len(priming)) // CACHE_BLOCK_TOKENS * CACHE_BLOCK_TOKENS


@pytest.fixture
async def responses_upstream() -> AsyncIterator[OpenAIUpstream]:
    agent = responses_tool_loop_responder("read_file", steps=20, arguments=lambda step, _k: {"path": f"f{step}"})

    def respond(request: Body) -> ResponsesReply:
        return ResponsesReply(text=SUMMARY) if instruction_of(request, "input") is not None else agent(request)

    async with OpenAIUpstream(context_window=32_000, responses_responder=respond) as fake:
        yield fake


async def test_responses_summary_calls_repeat_the_forwarded_input_tools_included(
    responses_upstream: OpenAIUpstream,
) -> None:
    started = LoopbackProxies(
        upstream=responses_upstream.base_url,
        context_windows={responses_agent.MODEL: 9000},
        strategies=STRATEGIES,
        # Each compaction rewrites from the instructions on: a summary planned before the conversation grew to the
        # trigger falls short, offloading makes up the rest, and the next summary follows an offloaded result.
        # (Kept heads plan for that growth, and this agent's summaries never fall short of it.)
        summary_head_share=0,
    )
    try:
        proxy = await started.start()
        async with (
            settling(proxy) as http,
            openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0, http_client=http) as client,
        ):
            await responses_agent.run_agent(client, 80, lambda turn: False)
    finally:
        await started.close()

    bodies = responses_upstream.responses_requests
    assert check_summary_prefixes(bodies, "input", ("model", "instructions", "tools")) >= 2
    summaries = [body for body in bodies if instruction_of(body, "input") is not None]
    assert any(read_tool_in(body) for body in summaries), "no summary followed an offloaded result"
