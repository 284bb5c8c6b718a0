"""Server-sent events on their way to the client: splitting, what they report, usage stripping.

The byte stream is split into events; the `data:` payloads are handed to the stream's wire format, which reads the
usage and the assistant's reply from them (`WireFormat.read_event`); the usage chunk the client did not ask for is
dropped (the proxy asks for one only where the format needs asking, see `ForwardPlan.strip_usage_chunk`).

When nothing is stripped the relayed bytes are exactly the upstream's, chunk for chunk; events are parsed from a
copy. When stripping, events are relayed one whole event at a time (a partial event waits for its end), the
usage-only chunk (`"choices": []` with a usage object) is dropped, and the `"usage": null` the upstream adds to
every other chunk under `include_usage` is removed, keeping the rest of each event's bytes as they were.

The upstream is trusted for nothing. Work per byte is linear whatever it sends (tiny chunks, huge events, floods of
blank lines), and whatever inspection cannot handle (an event past `MAX_PENDING`, an exception) stops inspection
for the rest of the stream: from then on the bytes are relayed untouched, held-back bytes included.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, Final

import orjson

from proxy.engine.messages import Message
from proxy.formats.event_bytes import SCALAR
from proxy.pipeline.wire import StreamReport, WireFormat

MAX_PENDING: Final = 8 * 1024 * 1024
"""An event longer than this (no blank line in sight) is not an SSE stream we understand: stop parsing it."""

_CR: Final = ord("\r")
_LF: Final = ord("\n")
"""Line ends as ints: `_CR in chunk` is one `memchr`, several times faster than `b"\r" in chunk`."""
_LINE_END: Final = re.compile(rb"\r\n|\r|\n")
_BLANK_LINES: Final = re.compile(rb"[\r\n]+")
"""A run of line ends: any run of CR and LF is CRLF, CR and LF line ends; a character class scans it 100 times faster
than the alternation it stands for (3 MiB of newlines: 5 ms, not 0.58 s)."""
_EVENT_END: Final = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r|\n)")
"""The end of a line that is followed by an empty line; a CR followed by LF is one line end, never two."""
_DATA_FIELD: Final = re.compile(rb"(?<![^\r\n])data(?::\x20?([^\r\n]*))?(?![^\r\n])")
"""A `data` line (at the start of a line, up to its end); group 1 is its value without the one optional space."""
_USAGE_NULL_AFTER: Final = re.compile(rb',\s*"usage"\s*:\s*null(?=\s*[,}])')
_USAGE_NULL: Final = b',"usage":null'
_VALUE_END: Final = frozenset(b'"]}0123456789el')
"""The bytes a JSON value (a string, an array, an object, a number, `true`, `false`, `null`) ends with."""
_LAST_MEMBERS: Final = re.compile(rb'(?:,"[^"\\\x00-\x1f]*":' + SCALAR + rb")*\}")
"""Members with plain values, then the end of the object: what may follow a top-level `"usage":null` (see
`without_usage_null`)."""
_USAGE_NULL_BEFORE: Final = re.compile(rb'"usage"\s*:\s*null\s*,\s*')


class StopReason(StrEnum):
    """Why a `StreamObserver` stopped inspecting (the rest of the stream is relayed untouched)."""

    EVENT_TOO_LONG = "event_too_long"
    """An event grew past `MAX_PENDING` bytes without ending."""
    ERROR = "error"
    """Inspecting raised; `StreamObserver.error` names the exception type."""
    INFLATION_LIMIT = "inflation_limit"
    """A compressed stream inflated more than inspection allows (see `proxy.server.decoding`)."""
    UNDECODABLE = "undecodable"
    """A compressed stream could not be decompressed."""


class EventSplitter:
    """Cuts a byte stream into complete SSE events (each with its terminating blank line), keeping the raw bytes.

    A run of blank lines between events comes out as one piece (an "event" with no fields), so a flood of newlines
    costs one regular-expression match per chunk, not one Python step per line. Each byte is scanned a bounded
    number of times, however the stream is chunked.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._resume = 0  # where the search for the held-back event's end resumes: earlier bytes hold none

    @property
    def pending(self) -> int:
        """Bytes held back: the start of an event whose end has not arrived yet."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return the events they completed, in order, byte for byte as received."""
        buffer = self._buffer
        buffer += data
        size = len(buffer)
        events: list[bytes] = []
        start = resume = 0
        while start < size:
            blank = _BLANK_LINES.match(buffer, start)
            if blank is not None:
                end = blank.end() - (blank.end() == size and buffer[-1] == _CR)  # a final CR may become CRLF
                if end == start:
                    break
                events.append(bytes(buffer[start:end]))
                start = end
                continue
            found = _EVENT_END.search(buffer, max(start, self._resume))
            if found is None:
                resume = max(start, size - 2)  # an event end can only begin in the last two bytes
                break
            if found.end() == size and buffer[-1] == _CR:
                resume = found.start()  # the final CR may be the first half of a CRLF: wait for the next byte
                break
            events.append(bytes(buffer[start : found.end()]))
            start = found.end()
        del buffer[:start]
        self._resume = max(0, resume - start)
        return events

    def flush(self) -> bytes:
        """Return whatever is held back (an unterminated last event) and forget it."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        self._resume = 0
        return rest


def event_data(event: bytes) -> bytes | None:
    """Return the event's `data` (its data lines joined by LF, per the SSE spec), or None when it has none."""
    if not event.strip(b"\r\n"):
        return None  # a run of blank lines between events: nothing to scan, however long
    values = _DATA_FIELD.findall(event)
    return b"\n".join(values) if values else None


def data_lines(chunk: bytes) -> list[bytes] | None:
    """The events of a chunk of whole events of one `data` line each, ended by LF LF, as those lines; else None.

    That is how servers write a stream (an event or a few per read, as the client's reads catch up): such a chunk
    is cut by `bytes.split`, without the splitter's and `event_data`'s regular expressions, which cut any other
    chunk as the spec says.
    """
    if _CR in chunk or not chunk.endswith(b"\n\n"):
        return None
    if chunk.find(b"\n") == len(chunk) - 2:  # one event, as a paced stream's reads mostly are
        return [chunk[:-2]] if chunk.startswith(b"data:") else None
    lines = chunk[:-2].split(b"\n\n")
    for line in lines:
        if not line.startswith(b"data:") or _LF in line:
            return None
    return lines


def _line_data(line: bytes) -> bytes:
    """The data of a `data:` line: its value, without the one space that may open it."""
    return line[6:] if line.startswith(b" ", 5) else line[5:]


def without_usage_null(data: bytes) -> bytes | None:
    """`data` without its top-level `"usage":null` member, when written compact and its only mention of usage.

    Every chunk of a chat stream that includes usage has that member until the last (OpenAI's, under
    `stream_options.include_usage`), where a parse finds nothing; cut from the bytes, the chunk can be skimmed like
    any other (`StreamObserver`). None unless the member is the one `"usage"` in the bytes, written `,"usage":null`,
    right after a value, and only members with plain values (`SCALAR`) follow it to the last byte, a closing brace:
    a member of the top-level object, then, whenever the bytes are a JSON object (no closing bracket comes between,
    and no string can hold the quotes around its key), and the bytes without it are a JSON object exactly when they
    are one.
    """
    at = data.find(_USAGE_NULL)
    if at <= 0 or data[at - 1] not in _VALUE_END or data.count(b'"usage"') != 1:
        return None
    if _LAST_MEMBERS.fullmatch(data, at + len(_USAGE_NULL)) is None:
        return None
    return data[:at] + data[at + len(_USAGE_NULL) :]


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


def rewrite_event(event: bytes, data: bytes) -> bytes:
    """Return the event with its data line(s) replaced by one `data: <data>` line, other lines kept as they were."""
    whole = data_lines(event)
    if whole is not None and len(whole) == 1:
        return b"data: " + data + b"\n\n"  # the event is its one data line: what the general case makes of it
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
    """Watches (and, when stripping, edits) an SSE stream of a wire format on its way to the client.

    Never raises on what the upstream sends: once inspection fails or meets something it does not understand,
    `stopped` says why and the rest of the stream passes through untouched; what was learned until then (`usage`,
    `reply`) is incomplete and should not be trusted.

    :param wire: The stream's wire format: what its events report.
    :param strip_usage: Drop the usage-only chunk and the `"usage": null` members the proxy caused by injecting
        `stream_options.include_usage`.
    :param skim: Read the format's common events (text deltas) from their bytes (`WireFormat.skim_event`), parsing
        only the others; False parses every event, the reading that skimming is checked against.
    """

    def __init__(self, wire: WireFormat, *, strip_usage: bool, skim: bool = True) -> None:
        self.wire = wire
        self.strip_usage = strip_usage
        self.skim = skim
        self.report = StreamReport()
        self.stripped_chunks = 0
        self.stopped: StopReason | None = None
        self.error: str | None = None
        """The type name of the exception that stopped inspection (`StopReason.ERROR`)."""
        self._splitter = EventSplitter()

    @property
    def usage(self) -> dict[str, Any] | None:
        """The usage the stream reported, in chat-completion terms."""
        return self.report.usage

    @property
    def reply(self) -> Message | None:
        """The assistant message the stream amounts to so far."""
        return self.wire.reply_of(self.report)

    def feed(self, chunk: bytes) -> bytes:
        """Take bytes from the upstream; return the bytes to relay now (fewer when holding back a partial event)."""
        if self.stopped is not None:
            return chunk
        if not self._splitter.pending and (lines := data_lines(chunk)) is not None:
            if len(lines) == 1:  # the chunk is one event, as a paced stream's mostly are
                relayed = self._process(chunk, _line_data(lines[0]))
            else:
                relayed = b"".join(self._process(line + b"\n\n", _line_data(line)) for line in lines)
            return relayed if self.strip_usage else chunk
        relayed = b"".join(self._process(event) for event in self._splitter.feed(chunk))
        if self.stopped is None and self._splitter.pending > MAX_PENDING:
            self.stopped = StopReason.EVENT_TOO_LONG
        if self.stopped is not None:
            relayed += self._splitter.flush()
        return relayed if self.strip_usage else chunk

    def stop(self, reason: StopReason) -> bytes:
        """Stop inspecting; return the held-back bytes, which a stripping caller must relay before anything else."""
        self.stopped = self.stopped or reason
        return self._splitter.flush()

    def finish(self) -> bytes:
        """The upstream ended: return any held-back bytes (an unterminated last event), inspected but unedited."""
        rest = self._splitter.flush()
        if rest and self.stopped is None:
            try:
                self._read(event_data(rest))
            except Exception as exc:
                self._fail(exc)
        return rest if self.strip_usage else b""

    def _fail(self, exc: Exception) -> None:
        self.stopped = StopReason.ERROR
        self.error = type(exc).__name__

    def _read(self, data: bytes | None) -> dict[str, Any] | None:
        """Parse an event's data and fold it in; its JSON object (None when it has none)."""
        if data is None or data.strip() == b"[DONE]":
            return None
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(chunk, dict):
            return None
        self.wire.read_event(chunk, self.report)
        return chunk

    def _process(self, event: bytes, data: bytes | None = None) -> bytes:
        """Inspect one event (`data`: its data, when known); return it as it should be relayed.

        When stripping, that is without what the proxy caused (the usage chunk, `"usage": null`). Never raises: an
        exception stops inspection (`StopReason.ERROR`), and this event and every later one are relayed unedited.
        """
        if self.stopped is not None:
            return event
        try:
            data = event_data(event) if data is None else data
            if data is not None and self.skim:
                bare = without_usage_null(data)
                if self.wire.skim_event(data if bare is None else bare, self.report):
                    if bare is None or not self.strip_usage:
                        return event
                    return rewrite_event(event, bare) if self._object(bare) else event
            return self._parsed(event, data)
        except Exception as exc:
            self._fail(exc)
            return event

    def _parsed(self, event: bytes, data: bytes | None) -> bytes:
        """`_process` of an event the format does not skim: parsed, folded in, and stripped of what the proxy caused."""
        chunk = self._read(data)
        if not self.strip_usage or chunk is None or "usage" not in chunk:
            return event
        if chunk.get("choices") == [] and isinstance(chunk["usage"], dict):
            self.stripped_chunks += 1
            return b""
        if chunk["usage"] is None:
            assert data is not None  # _read parsed it
            return rewrite_event(event, _without_usage_null(data, chunk))
        return event

    @staticmethod
    def _object(data: bytes) -> bool:
        """Whether `data` parses to an object: a skim tells what a parse would read, not that one would succeed."""
        try:
            return isinstance(orjson.loads(data), dict)
        except orjson.JSONDecodeError:
            return False
