"""The proxy's read tool in the Responses API: its declaration, its calls in responses and streams, its results.

A read call is a `function_call` output item naming the read tool; its result goes back as a
`function_call_output` item answering its `call_id`. In a stream, an item's events carry its `output_index`, and
the final event (`response.completed`) carries the whole response, the read tool echoed in its `tools` too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from proxy.formats.responses.answers import FINAL_EVENTS
from proxy.pipeline.offload.rounds import drop_matching, kept_reads, names_read_tool
from proxy.pipeline.offload.tool import READ_TOOL_DECLARATION
from proxy.pipeline.wire import Reads, StreamReport

READ_TOOL: Final = {"type": "function", **READ_TOOL_DECLARATION}
"""The read tool as the Responses API declares a function tool."""

ENDING_EVENTS: Final = FINAL_EVENTS | {"response.failed", "error"}
"""Events after which nothing of the response is still to come."""


def _is_read_item(item: Any) -> bool:
    """Whether an output item is a call of the read tool."""
    return isinstance(item, Mapping) and item.get("type") == "function_call" and names_read_tool(item)


def output_reads(output: Sequence[Mapping[str, Any]], limit: int) -> Reads | None:
    """The reads of a response's output items, when its first function call is the proxy's (at most `limit`)."""
    calls = [item for item in output if item.get("type") == "function_call"]
    if not calls or not names_read_tool(calls[0]):
        return None
    reads = [item for item in calls if names_read_tool(item)]
    kept = kept_reads(reads, lambda item: item.get("arguments"), limit)
    chosen = {id(item) for item, _ in kept}
    appended = [dict(item) for item in output if item.get("type") != "function_call" or id(item) in chosen]
    ids = [(item.get("call_id", ""), reference) for item, reference in kept]
    return Reads(ids, appended, len(reads) - len(kept))


def _items(response: Mapping[str, Any] | None) -> list[Mapping[str, Any]] | None:
    output = response.get("output") if response is not None else None
    return [item for item in output if isinstance(item, Mapping)] if isinstance(output, list) else None


def reads(response: Mapping[str, Any], limit: int) -> Reads | None:
    """The reads a whole response asks for."""
    items = _items(response)
    return output_reads(items, limit) if items is not None else None


def stream_reads(report: StreamReport, limit: int) -> Reads | None:
    """The reads a streamed response asked for, from the response its final event carried."""
    return output_reads(_items(report.final) or [], limit)


def decides_reads(event: Mapping[str, Any]) -> bool | None:
    """Decided by the first output item that is a function call (by name) or a message; reasoning decides nothing."""
    kind = event.get("type")
    if isinstance(kind, str) and kind in ENDING_EVENTS:
        return False
    item = event.get("item") if kind == "response.output_item.added" else None
    if not isinstance(item, Mapping):
        return None
    if item.get("type") == "function_call":
        return names_read_tool(item)
    return False if item.get("type") == "message" else None


def without_reads(response: dict[str, Any]) -> bool:
    """Take the read calls out of a response's output, and the read tool out of its echoed tools."""
    return drop_matching(response, "output", _is_read_item) | drop_matching(response, "tools", names_read_tool)


def hide_read(event: dict[str, Any], hidden: set[Any]) -> bool | None:
    """Drop every event of a read call's item (None), and the read tool and calls from a response object."""
    item = event.get("item")
    if isinstance(item, dict) and _is_read_item(item):
        hidden.add(event.get("output_index"))
    if "output_index" in event and event["output_index"] in hidden:
        return None
    response = event.get("response")
    return isinstance(response, dict) and without_reads(response)


def asked_again(fields: dict[str, Any], asked: Reads, results: Sequence[str]) -> None:
    """Append the model's output with the read calls, then one `function_call_output` per result."""
    ids = [call_id for call_id, _ in asked.calls]
    outputs = [
        {"type": "function_call_output", "call_id": i, "output": text} for i, text in zip(ids, results, strict=True)
    ]
    fields["input"] = [*fields.get("input", []), *asked.appended, *outputs]
