"""A tool-using agent for long runs against the OpenAI-like upstream, shared by tests and benchmarks.

The model (`agent_responder`) reads files until a tool result starts with FINAL, sometimes two at once; the client
side keeps its whole history, as SDK users do. `messages_array` gives the exact bytes of what was forwarded, so a
run can check that each prompt extends the previous one byte for byte.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Awaitable, Callable
from typing import Any

from proxy.pipeline.summary_text import IN_CONTEXT_PREAMBLE
from proxy.simulator.openai_upstream import Reply, ToolCall

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
SUMMARY_TEXT = "## Objective\n- review the handlers in src/\n## Work done\n- read src/0.py and src/1.py\n"
_SUMMARY_MARK = IN_CONTEXT_PREAMBLE.split(":", 1)[0]

Turn = Callable[[list[dict[str, Any]]], Awaitable[tuple[dict[str, Any], str]]]
"""One model call: the history so far in, the assistant message and the response's `X-Compaction` header out."""


async def run_agent(
    turn: Turn, tasks: int, steps: int, *, result_lines: int = 6, turns: int | None = None
) -> list[str]:
    """Run `tasks` user tasks of `steps` tool rounds each, keeping the whole history client-side.

    :param result_lines: How many times each tool result repeats `FILE_TEXT` (6 is about 130 tokens).
    :param turns: Stop after this many model calls, in the middle of a task if need be.
    :returns: The `X-Compaction` header of every turn, in order.
    """
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a meticulous code reviewer."}]
    headers: list[str] = []
    for task in range(tasks):
        messages.append({"role": "user", "content": f"Task {task}: review the handlers in src/ and report."})
        for step in range(steps + 1):
            message, header = await turn(messages)
            headers.append(header)
            if len(headers) == turns:
                return headers
            messages.append(message)
            messages.extend(tool_results(message, final=step == steps - 1, lines=result_lines))
            if not message.get("tool_calls"):
                break
    return headers


def is_summary_call(body: dict[str, Any]) -> bool:
    """Whether a chat-completion body is the proxy's summary call (its last message is the summary instruction)."""
    last = body["messages"][-1]
    return last["role"] == "user" and str(last.get("content", "")).startswith(_SUMMARY_MARK)


def agent_responder() -> Callable[[dict[str, Any]], Reply]:
    """A model that reads files until a tool result says FINAL, sometimes two at once, and writes summaries asked."""
    ids = itertools.count(1)

    def respond(request: dict[str, Any]) -> Reply:
        if is_summary_call(request):
            return Reply(content=SUMMARY_TEXT)
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


def tool_results(message: dict[str, Any], final: bool, lines: int = 6) -> list[dict[str, Any]]:
    """The client's answers to an assistant message's tool calls; `final` makes the model stop after them.

    :param lines: How many times each result repeats `FILE_TEXT`.
    """
    return [
        {
            "role": "tool",
            "tool_call_id": call["id"],
            "content": ("FINAL " if final else "") + f"{call['function']['arguments']}\n" + FILE_TEXT * lines,
        }
        for call in message.get("tool_calls") or []
    ]


def messages_array(raw: bytes) -> bytes:
    """The exact bytes of the `messages` array inside a request body."""
    text = raw.decode()
    start = text.index("[", text.index('"messages"'))
    _value, end = json.JSONDecoder().raw_decode(text, start)
    return raw[start:end] if text.isascii() else text[start:end].encode()


async def collect_stream(stream: Any) -> dict[str, Any]:
    """The assistant message a streamed chat completion (the SDK's chunks) holds; checks it carried no usage."""
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
