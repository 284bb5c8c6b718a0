"""Undoing a request body's content coding, bounded so a small body cannot inflate without limit.

A compacted request sent compressed is decoded so it can be compacted like any other, and forwarded without its
coding: gzip and deflate with zlib, br and zstd with the libraries aiohttp's own decoders use, where installed (the
`codings` extra: Google's `Brotli`, and the standard library's `compression.zstd` from Python 3.14, its backport
`backports.zstd` before). A coding the proxy cannot undo (unknown, or its library missing) is no reason to refuse
what the provider may accept: it raises `UnsupportedCoding`, and the body goes upstream as it came. What is refused,
with a clear error, is a body that is not what its coding says (400), a gzip body of more members (or a zstd body of
more frames) than `max_gzip_members` (400), and a body that inflates past `max_body_bytes` (413), which also stops
compression bombs after `limit` bytes of output.

Decoding costs time linear in the body: each stream is fed to its decoder in pieces that double in size, so what the
decoder copies of the input after a stream's end (its `unused_data`) is never much more than the stream itself.
Feeding the whole remainder each time copied it once per gzip member: quadratic, 16 s of CPU for 4 MiB of empty
members.
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final, Protocol

from proxy.server.coding_errors import CorruptCoding, InflatesTooFar, TooManyMembers, UnsupportedCoding

FIRST_PIECE: Final = 4096
"""Compressed bytes fed to a decoder first; each later piece of the same stream is twice the one before."""


def _module(*names: str) -> ModuleType | None:
    """The first of the modules that imports, or None (the `codings` extra is not installed)."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


_brotli: Any = _module("brotli")
_zstd: Any = _module("compression.zstd", "backports.zstd")
_STREAM_ERRORS: Final[tuple[type[Exception], ...]] = (zlib.error, *((_zstd.ZstdError,) if _zstd is not None else ()))
"""What zlib's and zstd's decoders raise on data that is not of their coding."""


class _StreamDecoder(Protocol):
    """One compressed stream's decoder, as zlib's `decompressobj` and zstd's `ZstdDecompressor` both are."""

    @property
    def eof(self) -> bool:
        """Whether the stream has ended."""
        ...

    @property
    def unused_data(self) -> bytes:
        """What the input held after the stream's end."""
        ...

    def decompress(self, data: memoryview, max_length: int) -> bytes:
        """Decode `data`, returning at most `max_length` bytes."""
        ...


def inflate(body: bytes, content_encoding: str, limit: int, max_members: int) -> bytes:
    """The body without its content codings (a comma-separated list, applied in order), at most `limit` bytes.

    :param max_members: Most gzip members (or zstd frames) a body may hold: each costs a decoder of its own.
    :raises UnsupportedCoding: A coding the proxy cannot undo (not in `DECODERS`).
    :raises CorruptCoding: The body is not valid data of its coding.
    :raises TooManyMembers: A gzip body holds more than `max_members` members, or a zstd body more frames.
    :raises InflatesTooFar: The decompressed body is larger than `limit` bytes.
    """
    codings = [coding.strip() for coding in content_encoding.lower().split(",")]
    codings = [coding for coding in codings if coding and coding != "identity"]
    for coding in codings:
        if coding not in DECODERS:
            raise UnsupportedCoding(
                f"Content-Encoding {coding[:32]!r} cannot be undone by the proxy (it decodes {', '.join(DECODERS)});"
                " the request was forwarded as it came, not compacted."
            )
    for coding in reversed(codings):
        body = DECODERS[coding](body, limit, max_members)
    return body


def _gunzip(body: bytes, limit: int, max_members: int) -> bytes:
    """Decompress every gzip member of `body` (RFC 1952 allows several, one after another)."""
    return _members(
        body, limit, max_members, lambda: zlib.decompressobj(zlib.MAX_WBITS | 16), coding="gzip", unit="member"
    )


def _unzstd(body: bytes, limit: int, max_members: int) -> bytes:
    """Decompress every zstd frame of `body` (RFC 8878 allows several, one after another)."""
    return _members(body, limit, max_members, _zstd.ZstdDecompressor, coding="zstd", unit="frame")


def _inflate_deflate(body: bytes, limit: int, _max_members: int) -> bytes:
    """HTTP's `deflate` is zlib-wrapped (RFC 9110), though some clients send raw deflate: accept both."""
    data = memoryview(body)
    try:
        inflated, end = _decompress(data, 0, zlib.decompressobj(zlib.MAX_WBITS), limit, "deflate")
    except CorruptCoding:
        inflated, end = _decompress(data, 0, zlib.decompressobj(-zlib.MAX_WBITS), limit, "deflate")
    if end < len(data):
        raise CorruptCoding("The deflate request body has data after its end.")
    return inflated


def _members(
    body: bytes, limit: int, max_members: int, new: Callable[[], _StreamDecoder], *, coding: str, unit: str
) -> bytes:
    """Every stream of `body`, one after another, each with a decoder of its own (at most `max_members` of them)."""
    data = memoryview(body)
    parts: list[bytes] = []
    size = offset = 0
    while offset < len(data):
        if len(parts) == max_members:
            raise TooManyMembers(
                f"The {coding} request body holds more than {max_members} {coding} {unit}s (setting"
                f" max_gzip_members); send it as one {coding} stream."
            )
        member, offset = _decompress(data, offset, new(), limit - size, coding)
        parts.append(member)
        size += len(member)
    return b"".join(parts)


def _decompress(data: memoryview, start: int, decoder: _StreamDecoder, limit: int, coding: str) -> tuple[bytes, int]:
    """The compressed stream of `data` at `start`, at most `limit` bytes of it, and the offset where it ends."""
    parts: list[bytes] = []
    size, position, piece = 0, start, FIRST_PIECE
    while not decoder.eof:
        if position == len(data):
            raise CorruptCoding(f"The {coding} request body is truncated.")
        end = min(position + piece, len(data))
        try:
            out = decoder.decompress(data[position:end], limit + 1 - size)
        except _STREAM_ERRORS:
            raise CorruptCoding(f"The request body is not valid {coding} data.") from None
        size = _counted(parts, out, size, limit)
        position, piece = end, piece * 2
    return b"".join(parts), position - len(decoder.unused_data)


def _unbrotli(body: bytes, limit: int, _max_members: int) -> bytes:
    """A `br` body decoded (one stream; data after its end is corrupt)."""
    decoder = _brotli.Decompressor()
    data = memoryview(body)
    parts: list[bytes] = []
    size, position, piece = 0, 0, FIRST_PIECE
    while not decoder.is_finished():
        chunk: bytes | memoryview = b""
        if decoder.can_accept_more_data():
            if position == len(data):
                raise CorruptCoding("The br request body is truncated.")
            chunk, position, piece = data[position : position + piece], position + piece, piece * 2
        try:
            out = decoder.process(chunk, output_buffer_limit=limit + 1 - size)
        except _brotli.error:
            raise CorruptCoding("The request body is not valid br data.") from None
        size = _counted(parts, out, size, limit)
    if position < len(data):
        raise CorruptCoding("The br request body has data after its end.")
    return b"".join(parts)


def _counted(parts: list[bytes], out: bytes, size: int, limit: int) -> int:
    """Append `out` to the decoded `parts` and return their size, or raise once it passes `limit`.

    Each decoder is asked for at most one byte past what is left, so one past the limit is where decoding stops.
    """
    parts.append(out)
    size += len(out)
    if size > limit:
        raise InflatesTooFar(f"The request body decompresses to more than the proxy's limit of {limit} bytes.")
    return size


DECODERS: Final[dict[str, Callable[[bytes, int, int], bytes]]] = {
    "gzip": _gunzip,
    "x-gzip": _gunzip,
    "deflate": _inflate_deflate,
    **({"br": _unbrotli} if _brotli is not None else {}),
    **({"zstd": _unzstd} if _zstd is not None else {}),
}
"""Every content coding the proxy undoes (`decode(body, limit, max_members)`), by name."""
