"""Long tool-using runs through the real proxy with the official SDK: nothing overflows, prefixes stay stable."""

from __future__ import annotations

import itertools
import json
from typing import Any

import aiohttp
import openai
import pytest

from tests.e2e.conftest import MODEL, StartProxy
from tests.support.openai_upstream import OpenAIUpstream, Reply, ToolCall

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
]
FILE_TEXT = "def handler(event, context):\n    return process(event['records'], retries=3)\n"


def agent_responder() -> Any:
    """A model that reads files until a tool result says FINAL, sometimes two at once."""
    ids = itertools.count(1)

    def respond(request: dict[str, Any]) -> Reply:
        last = request["messages"][-1]
        if last["role"] == "tool" and str(last.get("content", "")).startswith("FINAL"):
            return Reply(content="All files read; the handler retries three times.")
        parallel = 2 if len(request["messages"]) % 3 == 0 else 1
        return Reply(
            tool_calls=tuple(
                ToolCall(id=f"call_{next(ids)}", name="read_file", arguments=json.dumps({"path": f"src/{n}.py"}))
                for n in range(parallel)
            )
        )

    return respond


def messages_array(raw: bytes) -> bytes:
    """The exact bytes of the `messages` array inside a request body."""
    text = raw.decode()
    start = text.index("[", text.index('"messages"'))
    _value, end = json.JSONDecoder().raw_decode(text, start)
    return raw[start:end] if text.isascii() else text[start:end].encode()


async def run_agent(client: openai.AsyncOpenAI, tasks: int, steps: int, stream: bool = False) -> list[str]:
    """Run `tasks` user tasks of `steps` tool rounds each, keeping the full history client-side like an SDK user."""
    messages: list[Any] = [{"role": "system", "content": "You are a meticulous code reviewer."}]
    compaction_headers: list[str] = []
    for task in range(tasks):
        messages.append({"role": "user", "content": f"Task {task}: review the handlers in src/ and report."})
        for step in range(steps + 1):
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, tools=TOOLS, stream=stream
            )
            compaction_headers.append(raw.headers.get("x-compaction", ""))
            if stream:
                message = await _collect_stream(raw.parse())
            else:
                message = raw.parse().choices[0].message.model_dump(exclude_none=True)
            messages.append(message)
            for call in message.get("tool_calls") or []:
                final = step == steps - 1
                content = ("FINAL " if final else "") + f"{call['function']['arguments']}\n" + FILE_TEXT * 6
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
            if not message.get("tool_calls"):
                break
    return compaction_headers


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
        headers = await run_agent(client, tasks=tasks, steps=steps, stream=stream)

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
        assert response.headers["X-Compaction"] == "compacted"  # what enforce would have done
        await response.read()
    assert upstream.requests[-1].body == raw
