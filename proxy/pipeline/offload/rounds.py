"""One read round, in both wire formats: the model's calls to the read tool, the request asking again, usage summed.

The rule for an answer that calls tools is decided by its *first* call, the same way streamed and not:

- The first call is the proxy's read tool: the proxy answers every read call of the answer, appends the calls (with
  the reasoning and text that came with them) and their results to the conversation it forwarded, and asks again.
  Client calls in that answer are left out: the model, having read, asks for them again if it still needs them.
- The first call is a client tool: the answer goes to the client, without any read call it also made (a stream is
  relayed from that first call on, so its read calls cannot be answered any more; the model can read next turn).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.engine.json_bytes import json_bytes
from proxy.pipeline.exchange import Api
from proxy.pipeline.offload.tool import READ_TOOL, reference_of


@dataclass(frozen=True)
class Reads:
    """What the model asked the proxy to read in one answer, and what goes back into the conversation with it.

    :param calls: `(call id, reference)` of each read call kept; the reference is None when the arguments name none.
    :param appended: The messages (chat) or items (Responses) to append before the results: the model's output with
        only the kept read calls.
    :param left_out: Read calls left out: repeats of a reference within the answer, and calls past the limit.
    """

    calls: list[tuple[str, str | None]]
    appended: list[dict[str, Any]] = field(default_factory=list)
    left_out: int = 0


def chat_reads(message: Mapping[str, Any] | None, limit: int) -> Reads | None:
    """The reads of a chat answer's message, when its first tool call is the proxy's (at most `limit`, distinct)."""
    calls = message.get("tool_calls") if message else None
    if not isinstance(calls, list) or not calls or not _is_read_call(calls[0]):
        return None
    assert message is not None
    reads = [call for call in calls if _is_read_call(call)]
    kept = _kept(reads, lambda call: call["function"].get("arguments"), limit)
    assistant = {"role": "assistant", "content": message.get("content"), "tool_calls": [call for call, _ in kept]}
    ids = [(call.get("id", ""), reference) for call, reference in kept]
    return Reads(ids, [assistant], len(reads) - len(kept))


def responses_reads(output: Sequence[Mapping[str, Any]], limit: int) -> Reads | None:
    """The reads of a response's output items, when its first function call is the proxy's (at most `limit`)."""
    calls = [item for item in output if item.get("type") == "function_call"]
    if not calls or not _is_read(calls[0]):
        return None
    reads = [item for item in calls if _is_read(item)]
    kept = _kept(reads, lambda item: item.get("arguments"), limit)
    chosen = {id(item) for item, _ in kept}
    appended = [dict(item) for item in output if item.get("type") != "function_call" or id(item) in chosen]
    ids = [(item.get("call_id", ""), reference) for item, reference in kept]
    return Reads(ids, appended, len(reads) - len(kept))


def _kept(
    calls: list[Mapping[str, Any]], arguments: Callable[[Mapping[str, Any]], Any], limit: int
) -> list[tuple[Mapping[str, Any], str | None]]:
    """The first `limit` read calls with their references, each reference once (calls naming none are each kept)."""
    kept: list[tuple[Mapping[str, Any], str | None]] = []
    seen: set[str] = set()
    for call in calls:
        if len(kept) == limit:
            break
        reference = reference_of(arguments(call))
        if reference is None or reference not in seen:
            kept.append((call, reference))
        if reference is not None:
            seen.add(reference)
    return kept


def _is_read(function: Any) -> bool:
    """Whether a chat call's `function`, or a Responses function call item, names the read tool."""
    return isinstance(function, Mapping) and function.get("name") == READ_TOOL


def _is_read_call(call: Any) -> bool:
    """Whether a chat `tool_calls` entry calls the read tool."""
    return isinstance(call, Mapping) and _is_read(call.get("function"))


def without_reads(answer: dict[str, Any], api: Api) -> bool:
    """Take the read calls (and, from a response object, the echoed read tool) out of an answer; whether any was."""
    if api is Api.RESPONSES:
        return _drop(answer, "output", _is_read_item) | _drop(answer, "tools", _is_read)
    removed = False
    for choice in choices_of(answer):
        message = choice.get("message")
        removed |= isinstance(message, dict) and _drop(message, "tool_calls", _is_read_call)
    return removed


def choices_of(chunk: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The well-formed entries of a completion's (or chunk's) `choices`: none when it is not a list."""
    choices = chunk.get("choices")
    return [choice for choice in choices if isinstance(choice, dict)] if isinstance(choices, list) else []


def _drop(owner: dict[str, Any], name: str, matches: Callable[[Any], bool]) -> bool:
    """Remove the entries of the list `owner[name]` that match; whether there were any."""
    entries = owner.get(name)
    if not isinstance(entries, list) or not any(map(matches, entries)):
        return False
    owner[name] = [entry for entry in entries if not matches(entry)]
    return True


def _is_read_item(item: Any) -> bool:
    """Whether a Responses output item is a call of the read tool."""
    return isinstance(item, Mapping) and item.get("type") == "function_call" and _is_read(item)


def asked_again(body: bytes, api: Api, reads: Reads, results: Sequence[str], *, last: bool) -> bytes:
    """The forwarded request with the model's read calls and their results appended, asking again.

    :param last: No more reads will be answered: the request asks for an answer without tools (`tool_choice: none`).
    """
    fields = orjson.loads(body)
    ids = [call_id for call_id, _ in reads.calls]
    if api is Api.RESPONSES:
        outputs = [
            {"type": "function_call_output", "call_id": i, "output": text} for i, text in zip(ids, results, strict=True)
        ]
        fields["input"] = [*fields.get("input", []), *reads.appended, *outputs]
    else:
        answers = [{"role": "tool", "tool_call_id": i, "content": text} for i, text in zip(ids, results, strict=True)]
        fields["messages"] = [*fields["messages"], *reads.appended, *answers]
    if last:
        fields["tool_choice"] = "none"
    return json_bytes(fields)


def without_tools(body: bytes) -> bytes:
    """The forwarded request asking for an answer without tools (`tool_choice: none`), nothing else changed."""
    return json_bytes({**orjson.loads(body), "tool_choice": "none"})


def summed(usages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The usage of several upstream calls added up, field by field (nested details too)."""
    total: dict[str, Any] = {}
    for usage in usages:
        for name, value in usage.items():
            if isinstance(value, Mapping):
                total[name] = summed([total.get(name) or {}, value])
            elif isinstance(value, int) and not isinstance(value, bool):
                previous = total.get(name)
                total[name] = (previous if isinstance(previous, int) else 0) + value
            elif name not in total:
                total[name] = value
    return total


def stream_decision(chunk: Mapping[str, Any], api: Api) -> bool | None:
    """Whether a stream is a read round (True), is for the client (False), or undecided yet (None), from one chunk.

    Chat: decided by the first tool-call delta (by its function name) or the first text. Responses: by the first
    output item that is a function call (by name) or a message; reasoning items come before either and decide
    nothing. A stream that ends undecided is the client's.
    """
    if api is Api.RESPONSES:
        kind = chunk.get("type")
        if isinstance(kind, str) and kind in {"response.completed", "response.incomplete", "response.failed", "error"}:
            return False
        item = chunk.get("item") if kind == "response.output_item.added" else None
        if not isinstance(item, Mapping):
            return None
        if item.get("type") == "function_call":
            return _is_read(item)
        return False if item.get("type") == "message" else None
    for choice in choices_of(chunk):
        delta = choice.get("delta")
        if not isinstance(delta, Mapping):
            continue
        calls = delta.get("tool_calls")
        if isinstance(calls, list) and calls and isinstance(calls[0], Mapping):
            return _is_read(calls[0].get("function"))
        if delta.get("content") or choice.get("finish_reason"):
            return False
    return None
