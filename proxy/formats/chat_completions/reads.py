"""The proxy's read tool in chat completions: its declaration, its calls in answers and streams, its results.

A read call is a `tool_calls` entry whose `function.name` is the read tool; its result goes back as a `tool`
message answering the call's id. In a stream, calls arrive as deltas of `choices[].delta.tool_calls`, keyed by
their choice and their `index`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from proxy.formats.chat_completions.answers import choices_of, first_message
from proxy.formats.chat_completions.reply import ReplyBuilder
from proxy.pipeline.offload.rounds import drop_matching, kept_reads, names_read_tool
from proxy.pipeline.offload.tool import READ_TOOL_DECLARATION
from proxy.pipeline.wire import Reads, StreamReport

READ_TOOL: Final = {"type": "function", "function": dict(READ_TOOL_DECLARATION)}
"""The read tool as a chat completion declares a tool."""


def _is_read_call(call: Any) -> bool:
    """Whether a `tool_calls` entry calls the read tool."""
    return isinstance(call, Mapping) and names_read_tool(call.get("function"))


def message_reads(message: Mapping[str, Any] | None, limit: int) -> Reads | None:
    """The reads of an answer's message, when its first tool call is the proxy's (at most `limit`, distinct)."""
    calls = message.get("tool_calls") if message else None
    if not isinstance(calls, list) or not calls or not _is_read_call(calls[0]):
        return None
    assert message is not None
    reads = [call for call in calls if _is_read_call(call)]
    kept = kept_reads(reads, lambda call: call["function"].get("arguments"), limit)
    assistant = {"role": "assistant", "content": message.get("content"), "tool_calls": [call for call, _ in kept]}
    ids = [(call.get("id", ""), reference) for call, reference in kept]
    return Reads(ids, [assistant], len(reads) - len(kept))


def reads(completion: Mapping[str, Any], limit: int) -> Reads | None:
    """The reads a whole completion asks for."""
    return message_reads(first_message(completion), limit)


def stream_reads(report: StreamReport, limit: int) -> Reads | None:
    """The reads a streamed completion asked for, from its reassembled reply."""
    return message_reads(report.reply.build() if isinstance(report.reply, ReplyBuilder) else None, limit)


def decides_reads(chunk: Mapping[str, Any]) -> bool | None:
    """Decided by the first tool-call delta (by its function's name) or the first text or finish."""
    for choice in choices_of(chunk):
        delta = choice.get("delta")
        if not isinstance(delta, Mapping):
            continue
        calls = delta.get("tool_calls")
        if isinstance(calls, list) and calls and isinstance(calls[0], Mapping):
            return names_read_tool(calls[0].get("function"))
        if delta.get("content") or choice.get("finish_reason"):
            return False
    return None


def without_reads(completion: dict[str, Any]) -> bool:
    """Take the read calls out of every choice's message; whether there were any."""
    removed = False
    for choice in choices_of(completion):
        message = choice.get("message")
        removed |= isinstance(message, dict) and drop_matching(message, "tool_calls", _is_read_call)
    return removed


def hide_read(chunk: dict[str, Any], hidden: set[Any]) -> bool | None:
    """Drop the read calls' deltas (`hidden` keys them by choice and call index); whether any was dropped."""
    dropped = False
    for choice in choices_of(chunk):
        delta = choice.get("delta")
        calls = delta.get("tool_calls") if isinstance(delta, dict) else None
        if not isinstance(calls, list):
            continue
        assert isinstance(delta, dict)
        kept = [call for call in calls if not _hidden_call(choice.get("index"), call, hidden)]
        if len(kept) < len(calls):
            dropped = True
            if kept:
                delta["tool_calls"] = kept
            else:
                del delta["tool_calls"]
    return dropped


def _hidden_call(choice: Any, call: Any, hidden: set[Any]) -> bool:
    if not isinstance(call, dict):
        return False
    key = (choice, call.get("index"))
    if names_read_tool(call.get("function")):
        hidden.add(key)
    return key in hidden


def asked_again(fields: dict[str, Any], asked: Reads, results: Sequence[str]) -> None:
    """Append the assistant message with the read calls, then one `tool` message per result."""
    ids = [call_id for call_id, _ in asked.calls]
    answers = [{"role": "tool", "tool_call_id": i, "content": text} for i, text in zip(ids, results, strict=True)]
    fields["messages"] = [*fields["messages"], *asked.appended, *answers]
