"""Undoing a request body's content coding (gzip, deflate), bounded so a small body cannot inflate without limit.

A chat completion sent compressed is decompressed so it can be compacted like any other, and forwarded without its
coding. What cannot be undone is refused with a clear OpenAI-style error, never forwarded with compaction silently
skipped: a coding the proxy does not know (415), a body that is not what its coding says (400), and a body that
inflates past `max_body_bytes` (413), which also stops compression bombs after `limit` bytes of output.
"""

from __future__ import annotations

import zlib
from typing import Final

from aiohttp import web

from proxy.server.errors import error_response

_GZIP: Final = frozenset({"gzip", "x-gzip"})
_DEFLATE: Final = frozenset({"deflate"})


class ContentCodingError(Exception):
    """The body's content coding cannot be undone; `response()` is the answer for the client."""

    status = 400
    code = "invalid_content_encoding"

    def response(self) -> web.Response:
        """The OpenAI-style error answer."""
        return error_response(self.status, str(self), type_="invalid_request_error", code=self.code)


class UnsupportedCoding(ContentCodingError):
    """A content coding other than gzip and deflate."""

    status = 415
    code = "unsupported_content_encoding"


class CorruptCoding(ContentCodingError):
    """The body is not valid data of its declared coding."""


class InflatesTooFar(ContentCodingError):
    """The body decompresses to more than the limit."""

    status = 413
    code = "request_too_large"


def inflate(body: bytes, content_encoding: str, limit: int) -> bytes:
    """The body without its content codings (a comma-separated list, applied in order), at most `limit` bytes.

    :raises UnsupportedCoding: A coding other than gzip, deflate and identity.
    :raises CorruptCoding: The body is not valid data of its coding.
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
        body = _gunzip(body, limit) if coding in _GZIP else _inflate_deflate(body, limit)
    return body


def _gunzip(body: bytes, limit: int) -> bytes:
    """Decompress every gzip member of `body` (RFC 1952 allows several, one after another)."""
    parts: list[bytes] = []
    size = 0
    rest = body
    while rest:
        member, rest = _decompress(rest, zlib.MAX_WBITS | 16, limit - size, "gzip")
        parts.append(member)
        size += len(member)
    return b"".join(parts)


def _inflate_deflate(body: bytes, limit: int) -> bytes:
    """HTTP's `deflate` is zlib-wrapped (RFC 9110), though some clients send raw deflate: accept both."""
    try:
        data, rest = _decompress(body, zlib.MAX_WBITS, limit, "deflate")
    except CorruptCoding:
        data, rest = _decompress(body, -zlib.MAX_WBITS, limit, "deflate")
    if rest:
        raise CorruptCoding("The deflate request body has data after its end.")
    return data


def _decompress(data: bytes, wbits: int, limit: int, coding: str) -> tuple[bytes, bytes]:
    """One compressed stream of `data`, at most `limit` bytes of it, and whatever follows that stream."""
    decoder = zlib.decompressobj(wbits)
    try:
        out = decoder.decompress(data, limit + 1)
    except zlib.error:
        raise CorruptCoding(f"The request body is not valid {coding} data.") from None
    if len(out) > limit or decoder.unconsumed_tail:
        raise InflatesTooFar(f"The request body decompresses to more than the proxy's limit of {limit} bytes.")
    if not decoder.eof:
        raise CorruptCoding(f"The {coding} request body is truncated.")
    return out, decoder.unused_data
