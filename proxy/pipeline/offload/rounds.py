"""One read round, whatever the wire format: the model's read calls kept, the request asking again, usage summed.

The rule for an answer that calls tools is decided by its *first* call, the same way streamed and not:

- The first call is the proxy's read tool: the proxy answers every read call of the answer, appends the calls (with
  the reasoning and text that came with them) and their results to the conversation it forwarded, and asks again.
  Client calls in that answer are left out: the model, having read, asks for them again if it still needs them.
- The first call is a client tool: the answer goes to the client, without any read call it also made (a stream is
  relayed from that first call on, so its read calls cannot be answered any more; the model can read next turn).

Each format finds the calls in its own shapes (`WireFormat.reads`); what is shared lives here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from proxy.engine.json_bytes import json_bytes
from proxy.pipeline.offload.tool import READ_TOOL, reference_of
from proxy.pipeline.wire import Reads, WireFormat


def kept_reads(
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


def names_read_tool(declaration: Any) -> bool:
    """Whether a call (or a tool declaration) names the read tool: `{"name": READ_TOOL, ...}`."""
    return isinstance(declaration, Mapping) and declaration.get("name") == READ_TOOL


def drop_matching(owner: dict[str, Any], name: str, matches: Callable[[Any], bool]) -> bool:
    """Remove the entries of the list `owner[name]` that match; whether there were any."""
    entries = owner.get(name)
    if not isinstance(entries, list) or not any(map(matches, entries)):
        return False
    owner[name] = [entry for entry in entries if not matches(entry)]
    return True


def asked_again(body: bytes, wire: WireFormat, reads: Reads, results: Sequence[str], *, last: bool) -> bytes:
    """The forwarded request with the model's read calls and their results appended, asking again.

    :param last: No more reads will be answered: the request asks for an answer without tools
        (`WireFormat.answer_without_tools`).
    """
    fields = orjson.loads(body)
    wire.asked_again(fields, reads, results)
    if last:
        wire.answer_without_tools(fields)
    return json_bytes(fields)


def without_tools(body: bytes, wire: WireFormat) -> bytes:
    """The forwarded request asking for an answer without tools, nothing else changed."""
    fields = orjson.loads(body)
    wire.answer_without_tools(fields)
    return json_bytes(fields)


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
