"""Undoing a request body's content coding (gzip, deflate), bounded so a small body cannot inflate without limit.

A chat completion sent compressed is decompressed so it can be compacted like any other, and forwarded without its
coding. What cannot be undone is refused with a clear OpenAI-style error, never forwarded with compaction silently
skipped: a coding the proxy does not know (415), a body that is not what its coding says (400), a gzip body of more
members than `max_gzip_members` (400), and a body that inflates past `max_body_bytes` (413), which also stops
compression bombs after `limit` bytes of output.

Decoding costs time linear in the body: each stream is fed to zlib in pieces that double in size, so what zlib
copies of the input after a stream's end (its `unused_data`) is never much more than the stream itself. Feeding the
whole remainder each time copied it once per gzip member: quadratic, 16 s of CPU for 4 MiB of empty members.
"""

from __future__ import annotations

import zlib
from typing import Final

from aiohttp import web

from proxy.formats.chat_completions.errors import error_body as openai_error_body
from proxy.server.errors import ErrorShape, error_response

_GZIP: Final = frozenset({"gzip", "x-gzip"})
_DEFLATE: Final = frozenset({"deflate"})

_FIRST_PIECE: Final = 4096
"""Compressed bytes fed to zlib first; each later piece of the same stream is twice the one before."""


class ContentCodingError(Exception):
    """The body's content coding cannot be undone; `response()` is the answer for the client."""

    status = 400
    code = "invalid_content_encoding"

    def response(self, shape: ErrorShape = openai_error_body) -> web.Response:
        """The error answer, in `shape` (OpenAI's by default)."""
        return error_response(self.status, str(self), type_="invalid_request_error", code=self.code, shape=shape)


class UnsupportedCoding(ContentCodingError):
    """A content coding other than gzip and deflate."""

    status = 415
    code = "unsupported_content_encoding"


class CorruptCoding(ContentCodingError):
    """The body is not valid data of its declared coding."""


class TooManyMembers(ContentCodingError):
    """A gzip body of more members than allowed."""

    code = "too_many_gzip_members"


class InflatesTooFar(ContentCodingError):
    """The body decompresses to more than the limit."""

    status = 413
    code = "request_too_large"


def inflate(body: bytes, content_encoding: str, limit: int, max_members: int) -> bytes:
    """The body without its content codings (a comma-separated list, applied in order), at most `limit` bytes.

    :param max_members: Most gzip members a gzip-coded body may hold: each costs a decoder of its own.
    :raises UnsupportedCoding: A coding other than gzip, deflate and identity.
    :raises CorruptCoding: The body is not valid data of its coding.
    :raises TooManyMembers: A gzip body holds more than `max_members` members.
    :raises InflatesTooFar: The decompressed body is larger than `limit` bytes.
    """
    codings = [coding.strip() for coding in content_encoding.lower().split(",")]
    codings = [coding for coding in codings if coding and coding != "identity"]
    for coding in codings:
        if coding not in _GZIP | _DEFLATE:
            raise UnsupportedCoding(
                f"Content-Encoding {coding[:32]!r} is not supported for chat completions; send the body as gzip, "
                "deflate or uncompressed."
            )
    for coding in reversed(codings):
        body = _gunzip(body, limit, max_members) if coding in _GZIP else _inflate_deflate(body, limit)
    return body


def _gunzip(body: bytes, limit: int, max_members: int) -> bytes:
    """Decompress every gzip member of `body` (RFC 1952 allows several, one after another)."""
    data = memoryview(body)
    parts: list[bytes] = []
    size = offset = 0
    while offset < len(data):
        if len(parts) == max_members:
            raise TooManyMembers(
                f"The gzip request body holds more than {max_members} gzip members (setting max_gzip_members); "
                "send it as one gzip stream."
            )
        member, offset = _decompress(data, offset, zlib.MAX_WBITS | 16, limit - size, "gzip")
        parts.append(member)
        size += len(member)
    return b"".join(parts)


def _inflate_deflate(body: bytes, limit: int) -> bytes:
    """HTTP's `deflate` is zlib-wrapped (RFC 9110), though some clients send raw deflate: accept both."""
    data = memoryview(body)
    try:
        inflated, end = _decompress(data, 0, zlib.MAX_WBITS, limit, "deflate")
    except CorruptCoding:
        inflated, end = _decompress(data, 0, -zlib.MAX_WBITS, limit, "deflate")
    if end < len(data):
        raise CorruptCoding("The deflate request body has data after its end.")
    return inflated


def _decompress(data: memoryview, start: int, wbits: int, limit: int, coding: str) -> tuple[bytes, int]:
    """The compressed stream of `data` at `start`, at most `limit` bytes of it, and the offset where it ends."""
    decoder = zlib.decompressobj(wbits)
    parts: list[bytes] = []
    size, position, piece = 0, start, _FIRST_PIECE
    while not decoder.eof:
        if position == len(data):
            raise CorruptCoding(f"The {coding} request body is truncated.")
        end = min(position + piece, len(data))
        try:
            out = decoder.decompress(data[position:end], limit + 1 - size)
        except zlib.error:
            raise CorruptCoding(f"The request body is not valid {coding} data.") from None
        parts.append(out)
        size += len(out)
        if size > limit or decoder.unconsumed_tail:
            raise InflatesTooFar(f"The request body decompresses to more than the proxy's limit of {limit} bytes.")
        position, piece = end, piece * 2
    return b"".join(parts), position - len(decoder.unused_data)
