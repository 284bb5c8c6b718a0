"""Server-sent events as chat-completion streams use them: splitting, usage and reply capture, usage stripping.

The byte stream is split into events; the `data:` payloads give the `usage` and the assistant's reply; the usage
chunk the client did not ask for is dropped.

When nothing is stripped the relayed bytes are exactly the upstream's, chunk for chunk; events are parsed from a
copy. When stripping, events are relayed one whole event at a time (a partial event waits for its end), the
usage-only chunk (`"choices": []` with a usage object) is dropped, and the `"usage": null` the upstream adds to
every other chunk under `include_usage` is removed, keeping the rest of each event's bytes as they were.
"""

from __future__ import annotations

import re
from typing import Any, Final

import orjson

_LINE_END: Final = re.compile(rb"\r\n|\r|\n")
MAX_PENDING: Final = 8 * 1024 * 1024
"""An event longer than this (no blank line in sight) is not an SSE stream we understand: stop parsing it."""

_USAGE_NULL_AFTER: Final = re.compile(rb',\s*"usage"\s*:\s*null(?=\s*[,}])')
_USAGE_NULL_BEFORE: Final = re.compile(rb'"usage"\s*:\s*null\s*,\s*')


class EventSplitter:
    """Cuts a byte stream into complete SSE events (each with its terminating blank line), keeping the raw bytes."""

    def __init__(self) -> None:
        self._buffer = b""
        self._scanned = 0  # bytes of the buffer already known to hold no complete event end

    @property
    def pending(self) -> int:
        """Bytes held back: the start of an event whose end has not arrived yet."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return the events they completed, in order, byte for byte as received."""
        buffer = self._buffer + data
        events: list[bytes] = []
        start = 0
        position = self._scanned
        line_start = position
        while True:
            match = _LINE_END.search(buffer, position)
            if match is None:
                break
            if match.group() == b"\r" and match.end() == len(buffer):
                break  # a CR at the end may be the first half of CRLF: wait for the next byte
            if match.start() == line_start:  # an empty line ends the event
                events.append(buffer[start : match.end()])
                start = match.end()
            position = line_start = match.end()
        self._buffer = buffer[start:]
        self._scanned = line_start - start
        return events

    def flush(self) -> bytes:
        """Return whatever is held back (an unterminated last event) and forget it."""
        rest, self._buffer, self._scanned = self._buffer, b"", 0
        return rest


def event_data(event: bytes) -> bytes | None:
    """Return the event's `data` (its data lines joined by LF, per the SSE spec), or None when it has none."""
    lines: list[bytes] = []
    for line in _LINE_END.split(event):
        if line.startswith(b"data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(b" ") else value)
        elif line == b"data":
            lines.append(b"")
    return b"\n".join(lines) if lines else None


class ReplyBuilder:
    """Reassembles the first choice's assistant message from stream deltas.

    Content and refusal fragments are concatenated; tool calls are keyed by their `index`, taking id, type and
    function name from the chunks that carry them and concatenating the argument fragments.
    """

    def __init__(self) -> None:
        self.seen = False
        self.role: str | None = None
        self.content: list[str] = []
        self.refusal: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.function_call: dict[str, str] | None = None

    def add(self, delta: dict[str, Any]) -> None:
        """Fold one `choices[0].delta` in."""
        self.seen = True
        if isinstance(delta.get("role"), str):
            self.role = delta["role"]
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
        if isinstance(delta.get("refusal"), str):
            self.refusal.append(delta["refusal"])
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                self._add_tool_call(call)
        legacy = delta.get("function_call")
        if isinstance(legacy, dict):
            self.function_call = self.function_call or {"name": "", "arguments": ""}
            if isinstance(legacy.get("name"), str) and not self.function_call["name"]:
                self.function_call["name"] = legacy["name"]
            if isinstance(legacy.get("arguments"), str):
                self.function_call["arguments"] += legacy["arguments"]

    def _add_tool_call(self, call: dict[str, Any]) -> None:
        index = call.get("index", len(self.tool_calls))
        if not isinstance(index, int):
            return
        entry = self.tool_calls.setdefault(
            index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if isinstance(call.get("id"), str) and call["id"]:
            entry["id"] = call["id"]
        if isinstance(call.get("type"), str) and call["type"]:
            entry["type"] = call["type"]
        function = call.get("function")
        if isinstance(function, dict):
            if isinstance(function.get("name"), str) and function["name"] and not entry["function"]["name"]:
                entry["function"]["name"] = function["name"]
            if isinstance(function.get("arguments"), str):
                entry["function"]["arguments"] += function["arguments"]

    def build(self) -> dict[str, Any] | None:
        """Return `{"role": "assistant", "content": ..., "tool_calls": [...]}`, or None when no delta was seen."""
        if not self.seen:
            return None
        reply: dict[str, Any] = {
            "role": self.role or "assistant",
            "content": "".join(self.content) if self.content else None,
        }
        if self.refusal:
            reply["refusal"] = "".join(self.refusal)
        if self.tool_calls:
            reply["tool_calls"] = [self.tool_calls[index] for index in sorted(self.tool_calls)]
        if self.function_call is not None:
            reply["function_call"] = self.function_call
        return reply


def _without_usage_null(data: bytes, chunk: dict[str, Any]) -> bytes:
    """Return the chunk's JSON without its top-level `"usage": null`.

    That is the original bytes minus that member when it can be cut out textually (checked by re-parsing), else a
    compact re-serialization.
    """
    expected = {key: value for key, value in chunk.items() if key != "usage"}
    for pattern in (_USAGE_NULL_AFTER, _USAGE_NULL_BEFORE):
        candidate, count = pattern.subn(b"", data, count=1)
        if count:
            try:
                if orjson.loads(candidate) == expected:
                    return candidate
            except orjson.JSONDecodeError:
                pass
    return orjson.dumps(expected)


def _rewrite_event(event: bytes, data: bytes) -> bytes:
    """Return the event with its data line(s) replaced by one `data: <data>` line, other lines kept as they were."""
    parts = _LINE_END.split(event)
    terminator = _LINE_END.search(event)
    newline = terminator.group() if terminator else b"\n"
    lines: list[bytes] = []
    replaced = False
    for line in parts[:-2] if event.endswith((b"\n", b"\r")) else parts:
        if line.startswith(b"data:") or line == b"data":
            if not replaced:
                lines.append(b"data: " + data)
                replaced = True
            continue
        lines.append(line)
    return newline.join(lines) + newline + newline


class StreamObserver:
    """Watches (and, when stripping, edits) a chat-completion SSE stream on its way to the client.

    :param strip_usage: Drop the usage-only chunk and the `"usage": null` members the proxy caused by injecting
        `stream_options.include_usage`.
    """

    def __init__(self, *, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self.usage: dict[str, Any] | None = None
        self.reply = ReplyBuilder()
        self.stripped_chunks = 0
        self.parsing = True
        self._splitter = EventSplitter()

    def feed(self, chunk: bytes) -> bytes:
        """Take bytes from the upstream; return the bytes to relay now (fewer when holding back a partial event)."""
        if not self.parsing:
            return chunk
        events = self._splitter.feed(chunk)
        if self._splitter.pending > MAX_PENDING:
            self.parsing = False  # not a stream we understand: relay the rest untouched
            held = b"".join(events) + self._splitter.flush()
            return held if self.strip_usage else chunk
        if not self.strip_usage:
            for event in events:
                self._inspect(event)
            return chunk
        return b"".join(self._process(event) for event in events)

    def finish(self) -> bytes:
        """The upstream ended: return any held-back bytes (an unterminated last event), inspected but unedited."""
        rest = self._splitter.flush()
        if rest and self.parsing:
            self._inspect(rest)
        return rest if self.strip_usage else b""

    def _inspect(self, event: bytes) -> dict[str, Any] | None:
        data = event_data(event)
        if data is None or data.strip() == b"[DONE]":
            return None
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(chunk, dict):
            return None
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict) and choice.get("index", 0) == 0 and isinstance(choice.get("delta"), dict):
                self.reply.add(choice["delta"])
        return chunk

    def _process(self, event: bytes) -> bytes:
        chunk = self._inspect(event)
        if chunk is None or "usage" not in chunk:
            return event
        if chunk.get("choices") == [] and isinstance(chunk["usage"], dict):
            self.stripped_chunks += 1
            return b""
        if chunk["usage"] is None:
            data = event_data(event)
            assert data is not None  # _inspect parsed it
            return _rewrite_event(event, _without_usage_null(data, chunk))
        return event
