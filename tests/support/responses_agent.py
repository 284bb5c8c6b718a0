"""A tool-using agent on the official `openai` SDK's Responses API, as SDK users drive it: the whole history kept
client-side (`store=False`), function tools, and reasoning carried forward as `encrypted_content`.

The fake model (`responses_tool_loop_responder("read_file", ...)`) reads file after file; every result is large, so
the conversation outgrows a 32k window within 200 turns.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

import openai

MODEL: Final = "gpt-4.1"
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    }
]
FILE_TEXT: Final = "def handler(event, context):\n    return process(event['records'], retries=3)\n"


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
    events: Any = raw.parse()  # a stream of events: `stream` is not a literal, so the SDK's types cannot tell
    async for event in events:
        if event.type == "response.completed":
            completed = event.response
    assert completed is not None, "the stream ended without response.completed"
    return completed, header


async def run_agent(client: openai.AsyncOpenAI, turns: int, streamed: Callable[[int], bool]) -> list[str]:
    """Tasks of tool calls until `turns` model calls (streamed where `streamed(turn)` says); each turn's header."""
    items: list[dict[str, Any]] = []
    headers: list[str] = []
    task = 0
    while len(headers) < turns:
        items.append({"role": "user", "content": f"Task {task}: review module {task} and report what it does."})
        task += 1
        while len(headers) < turns:
            response, header = await respond(client, items, stream=streamed(len(headers)))
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
