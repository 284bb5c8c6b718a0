"""Long tool-using runs through the real proxy with the official SDK: nothing overflows, prefixes stay stable."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import openai
import pytest

from tests.e2e.conftest import MODEL, StartProxy
from tests.support.agent_run import FILE_TEXT, TOOLS, agent_responder, messages_array, run_agent
from tests.support.openai_upstream import OpenAIUpstream


async def sdk_agent(
    client: openai.AsyncOpenAI, tasks: int, steps: int, stream: bool = False, result_lines: int = 6
) -> list[str]:
    """The agent run through the official SDK, streamed or not; returns each turn's `X-Compaction`."""

    async def turn(messages: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            stream=stream,
        )
        if stream:
            message = await _collect_stream(raw.parse())
        else:
            message = raw.parse().choices[0].message.model_dump(exclude_none=True)
        return message, raw.headers.get("x-compaction", "")

    return await run_agent(turn, tasks, steps, result_lines=result_lines)


async def _collect_stream(stream: Any) -> dict[str, Any]:
    content = ""
    calls: dict[int, dict[str, Any]] = {}
    usage_chunks = 0
    async for chunk in stream:
        if chunk.usage is not None:
            usage_chunks += 1
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for call in delta.tool_calls or []:
                entry = calls.setdefault(
                    call.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                entry["id"] = call.id or entry["id"]
                if call.function:
                    entry["function"]["name"] += call.function.name or ""
                    entry["function"]["arguments"] += call.function.arguments or ""
    assert usage_chunks == 0, "the client did not ask for usage, so it must not see a usage chunk"
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[index] for index in sorted(calls)]
    return message


@pytest.mark.parametrize(("stream", "tasks", "steps"), [(False, 10, 20), (True, 4, 16)], ids=["json", "sse"])
async def test_long_tool_run_never_overflows_and_prefix_stays_byte_identical(
    upstream: OpenAIUpstream, start_proxy: StartProxy, stream: bool, tasks: int, steps: int
) -> None:
    upstream.responder = agent_responder()
    base_url = await start_proxy()
    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0) as client:
        headers = await sdk_agent(client, tasks=tasks, steps=steps, stream=stream)

    chat = [request for request in upstream.requests if request.path.endswith("/chat/completions")]
    assert len(chat) == len(headers) >= tasks * steps
    compactions = headers.count("compacted")
    assert 1 <= compactions <= len(headers) // 4, f"{compactions} compactions in {len(headers)} turns"
    # Between two compactions each forwarded prompt extends the previous one byte for byte.
    for previous, current, header in zip(chat, chat[1:], headers[1:], strict=False):
        if header == "compacted":
            continue
        before, after = messages_array(previous.body), messages_array(current.body)
        assert after.startswith(before[:-1]), "a turn without compaction changed the forwarded prefix"
    # Every forwarded request fitted the window, and the provider's prompt cache kept hitting.
    assert all(usage["prompt_tokens"] <= 4096 for usage in upstream.usages)
    cached = sum(usage["prompt_tokens_details"]["cached_tokens"] for usage in upstream.usages)
    prompt = sum(usage["prompt_tokens"] for usage in upstream.usages)
    assert cached / prompt > 0.5, f"only {cached / prompt:.0%} of prompt tokens were served from the cache"


async def test_observe_mode_forwards_byte_identical_bodies(upstream: OpenAIUpstream, start_proxy: StartProxy) -> None:
    upstream.context_window = 1_000_000
    base_url = await start_proxy(mode="observe")
    history = [{"role": "user" if turn % 2 == 0 else "assistant", "content": FILE_TEXT * 20} for turn in range(40)]
    # Deliberately odd formatting: observe mode must not even re-serialize it.
    raw = json.dumps({"model": MODEL, "messages": history, "stream": True}, indent=1).encode()
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{base_url}/chat/completions", data=raw, headers={"Authorization": "Bearer sk-test"}) as response,
    ):
        assert response.status == 200
        assert response.headers["X-Compaction"] == "would-compact"  # what enforce would have done
        await response.read()
    assert upstream.requests[-1].body == raw
