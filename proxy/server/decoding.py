"""Reading a copy of an upstream answer: its content coding undone (bounded), its JSON, what it reported.

Only copies are decoded, for inspection; the client always gets the upstream's bytes as they came. Inflation is
bounded by the compressed size (`inflation_allowance`): a small compressed answer never makes the proxy inflate,
parse or scan more than a fixed multiple of what the upstream actually sent, so per-byte work stays linear however
well the upstream's bytes compress. Past the allowance, inspection is given up and the answer relayed untouched.

Nothing the upstream sends is trusted: members of unexpected types are skipped, never raised on.
"""

from __future__ import annotations

import zlib
from typing import Any, Final

import orjson

from proxy.pipeline.exchange import UpstreamOutcome
from proxy.pipeline.wire import WireFormat
from proxy.server.coding_errors import ContentCodingError
from proxy.server.content_coding import inflate
from proxy.server.sse import StopReason, StreamObserver

DECOMPRESSED_LIMIT: Final = 64 * 1024 * 1024
"""A compressed non-streamed answer is decompressed (a copy, for parsing only) up to this many bytes at most."""

INFLATION_FLOOR: Final = 1024 * 1024
"""Bytes any compressed answer may inflate to for inspection, however small it is."""

INFLATION_RATIO: Final = 32
"""Beyond `INFLATION_FLOOR`, decompressed bytes allowed per compressed byte received. JSON and SSE compress about
5 to 20 times; a compression bomb (a flood of one repeated byte) about 1,000 times."""

MAX_MEMBERS: Final = 64
"""Gzip members a compressed non-streamed answer may hold to be inspected (gzip writers make one)."""

DECODABLE: Final = frozenset({"gzip", "x-gzip", "deflate"})
"""Content codings the proxy can undo for inspection."""


def inflation_allowance(compressed: int) -> int:
    """Decompressed bytes allowed for inspecting an answer of which `compressed` bytes arrived."""
    return INFLATION_FLOOR + INFLATION_RATIO * compressed


def decoded(body: bytes, encoding: str) -> bytes | None:
    """Return the body without its content coding (gzip or deflate; bounded), or None when that is not possible.

    None too when the body would inflate past `inflation_allowance` or `DECOMPRESSED_LIMIT`, or holds more than
    `MAX_MEMBERS` gzip members.
    """
    if encoding == "identity":
        return body  # nothing to undo (`inflate` would return it as it is)
    try:
        return inflate(body, encoding, min(inflation_allowance(len(body)), DECOMPRESSED_LIMIT), MAX_MEMBERS)
    except ContentCodingError:
        return None


def _json(body: bytes, encoding: str) -> Any:
    data = decoded(body, encoding)
    if data is None:
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def outcome_from_body(wire: WireFormat, status: int, body: bytes | None, encoding: str) -> UpstreamOutcome:
    """Build the outcome of a non-streamed answer (success or error) from its complete body, if it was kept."""
    parsed = _json(body, encoding) if body is not None else None
    if not isinstance(parsed, dict):
        return UpstreamOutcome(status=status)
    if 200 <= status < 300:
        usage, reply, response_id = wire.answer(parsed)
        return UpstreamOutcome(status=status, usage=usage, reply=reply, response_id=response_id)
    return UpstreamOutcome(status=status, error_body=parsed)


class Collector:
    """Keeps a copy of a non-streamed body for parsing, up to a limit (beyond it, parsing is given up)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0

    def __call__(self, chunk: bytes) -> bytes:
        """Keep a copy of `chunk` while within the limit; return it unchanged for relaying."""
        self.size += len(chunk)
        if self.size <= self.limit:
            self.parts.append(chunk)
        return chunk

    def body(self) -> bytes | None:
        """The whole body, or None when it outgrew the limit."""
        return b"".join(self.parts) if self.size <= self.limit else None


class DecodingObserver:
    """Feeds a decompressed copy of a compressed SSE stream to an observer; the relayed bytes stay compressed.

    Inflation stops (and with it inspection) once the stream would inflate past `inflation_allowance` of what has
    arrived, or when it cannot be decompressed.

    :param observer: A non-stripping observer: the client gets the compressed bytes, so nothing can be edited.
    :param encoding: One of `DECODABLE`.
    """

    def __init__(self, observer: StreamObserver, encoding: str) -> None:
        self.observer = observer
        self.decoder = zlib.decompressobj(47 if encoding in ("gzip", "x-gzip") else 15)
        self.received = 0
        self.inflated = 0

    def __call__(self, chunk: bytes) -> bytes:
        """Inspect a decompressed copy of `chunk` (while inspection lasts); return `chunk` unchanged for relaying."""
        if self.observer.stopped is None:
            self._inspect(chunk)
        return chunk

    def _inspect(self, chunk: bytes) -> None:
        self.received += len(chunk)
        try:
            data = self.decoder.decompress(chunk, inflation_allowance(self.received) - self.inflated)
        except zlib.error:
            self.observer.stop(StopReason.UNDECODABLE)
            return
        self.inflated += len(data)
        self.observer.feed(data)
        if self.decoder.unconsumed_tail:
            self.observer.stop(StopReason.INFLATION_LIMIT)  # nothing held back is relayed: the client has the original
