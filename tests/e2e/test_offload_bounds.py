"""Read rounds against a hostile model: however many reads it asks for, every round stays within the request's bounds.

The conversation is a 0.6 MB request of six 100 kB tool results, the older ones offloaded when it is compacted; the
upstream's model answers every round with 100 reads (of one reference, or of every one it sees) until it is told to
use no tools. Its own window is far larger than the proxy's, so it refuses nothing: the bounds are the proxy's.
"""

from __future__ import annotations

import re
from typing import Any

import openai
import orjson
import pytest

from proxy.pipeline.offload.tool import READ_TOOL
from proxy.simulator.openai_upstream import OpenAIUpstream, Reply, ToolCall
from proxy.simulator.responses_api import FunctionCall, ResponsesReply
from tests.e2e.conftest import MODEL, StartProxy
from tests.e2e.test_offload_reads import CLIENT_TOOLS, RESPONSES_TOOLS, chat_bodies

WINDOW = 128_000
MAX_BODY = 1024 * 1024
ROUNDS = 4
_REFERENCE = re.compile(r"offloaded-[0-9a-f]{32}")


def result(k: int) -> str:
    """A 100 kB tool result, distinct for each `k`."""
    lines = (f"run {k} step {i}: checksum {i * 7919 % 100_003} status ok\n" for i in range(10**6))
    text = ""
    while len(text) < 100_000:
        text += next(lines)
    return text


def conversation() -> list[dict[str, Any]]:
    """Six large results of `fetch_log`, then the question."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Investigate the failed builds."}]
    for k in range(6):
        call = {"id": f"call_{k}", "type": "function", "function": {"name": "fetch_log", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{k}", "content": result(k)},
        ]
    return [*messages, {"role": "user", "content": "Which run failed?"}]


def items() -> list[dict[str, Any]]:
    """`conversation` as Responses input items."""
    converted: list[dict[str, Any]] = []
    for message in conversation():
        if message["role"] == "tool":
            converted.append(
                {"type": "function_call_output", "call_id": message["tool_call_id"], "output": message["content"]}
            )
        elif message.get("tool_calls"):
            call = message["tool_calls"][0]
            converted.append({"type": "function_call", "call_id": call["id"], "name": "fetch_log", "arguments": "{}"})
        else:
            converted.append(message)
    return converted


def hostile_responses(request: dict[str, Any]) -> ResponsesReply:
    """`hostile("one")` on the Responses API."""
    if request.get("tool_choice") == "none":
        return ResponsesReply(text="done reading")
    (reference, *_) = _REFERENCE.findall(orjson.dumps(request["input"]).decode())
    arguments = f'{{"reference": "{reference}"}}'
    return ResponsesReply(
        function_calls=tuple(
            FunctionCall(READ_TOOL, arguments, f"read-{len(request['input'])}-{k}") for k in range(100)
        )
    )


def hostile(which: str) -> Any:
    """A model that answers every round with 100 reads: of the first reference it sees, or of each in turn."""

    def respond(request: dict[str, Any]) -> Reply:
        if request.get("tool_choice") == "none":
            return Reply(content="done reading")
        references = list(dict.fromkeys(_REFERENCE.findall(orjson.dumps(request["messages"]).decode())))
        if which == "one":
            references = references[:1]
        calls = (
            ToolCall(
                f"read-{len(request['messages'])}-{k}",
                READ_TOOL,
                f'{{"reference": "{references[k % len(references)]}"}}',
            )
            for k in range(100)
        )
        return Reply(tool_calls=tuple(calls))

    return respond


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("which", ["one", "every"])
async def test_a_hostile_model_cannot_grow_the_rounds(
    upstream: OpenAIUpstream, start_proxy: StartProxy, which: str, stream: bool
) -> None:
    upstream.responder = hostile(which)
    upstream.context_window = 10 * WINDOW
    body = orjson.dumps({"model": MODEL, "messages": conversation()})
    assert 600_000 < len(body) < MAX_BODY
    base_url = await start_proxy(context_windows={MODEL: WINDOW}, max_body_bytes=MAX_BODY, offload_read_rounds=ROUNDS)
    async with openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0) as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(
            model=MODEL, messages=conversation(), tools=CLIENT_TOOLS, stream=stream
        )
        if stream:
            content = "".join([chunk.choices[0].delta.content or "" async for chunk in raw.parse() if chunk.choices])
        else:
            content = raw.parse().choices[0].message.content or ""
    assert content == "done reading"
    offloaded = int(raw.headers["x-compaction-offloaded"])
    assert offloaded >= 3
    sent = [request.body for request in upstream.requests if request.path.endswith("/chat/completions")]
    assert max(map(len, sent)) <= MAX_BODY
    assert max(usage["prompt_tokens"] for usage in upstream.usages) <= WINDOW
    assert len(sent) == ROUNDS + 1
    last = chat_bodies(upstream)[-1]["messages"]
    read_back = [message["content"] for message in last if str(message.get("tool_call_id")).startswith("read-")]
    reads = sum(len(text) >= 100_000 for text in read_back)  # each text once, whatever was asked
    assert 1 <= reads <= (1 if which == "one" else offloaded)
    # A stream's headers go out before the model decides to read: only a whole answer says how many were read.
    assert raw.headers.get("x-compaction-reads") == (None if stream else str(reads))


@pytest.mark.parametrize("stream", [False, True])
async def test_a_hostile_responses_model_cannot_grow_the_rounds(
    upstream: OpenAIUpstream, start_proxy: StartProxy, stream: bool
) -> None:
    upstream.responses_responder = hostile_responses
    upstream.context_window = 10 * WINDOW
    base_url = await start_proxy(context_windows={MODEL: WINDOW}, max_body_bytes=MAX_BODY, offload_read_rounds=ROUNDS)
    async with openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0) as sdk:
        raw = await sdk.responses.with_raw_response.create(
            model=MODEL, input=items(), tools=RESPONSES_TOOLS, stream=stream
        )
        if stream:
            events = [event async for event in raw.parse()]
            (response,) = [event.response for event in events if event.type == "response.completed"]
        else:
            response = raw.parse()
    assert response.output_text == "done reading"
    sent = [request.body for request in upstream.requests if request.path.endswith("/responses")]
    assert max(map(len, sent)) <= MAX_BODY
    assert max(usage["input_tokens"] for usage in upstream.responses_usages) <= WINDOW
    assert len(sent) == ROUNDS + 1
    assert raw.headers.get("x-compaction-reads") == (None if stream else "1")
