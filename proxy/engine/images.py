"""What an image in a message costs, counted the way OpenAI bills it rather than as base64 text.

A 1 MB screenshot is about 1.3 MB of base64: counted as text it would look like 350k tokens, where OpenAI charges
a few hundred. The vision models price an image by tiles: `low` detail is a flat 85 tokens; otherwise the image is
scaled to fit 2048x2048, then down so its shortest side is at most 768 px, and costs 85 + 170 per 512 px tile. The
size is read from the header of a `data:` URL (PNG, JPEG, GIF, WebP) without decoding the whole image; an image given
by remote URL, or one whose header cannot be read, is charged `DEFAULT_IMAGE_TOKENS`.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct

BASE_TOKENS = 85
"""What every image costs, and all that a `low` detail image costs."""

TILE_TOKENS = 170
"""What each 512 px tile of a `high` (or `auto`) detail image adds."""

DEFAULT_IMAGE_TOKENS = BASE_TOKENS + 4 * TILE_TOKENS
"""The charge for an image of unknown size: 765 tokens, what a 1024x1024 image costs at high detail."""

_MAX_HEADER_BYTES = 256 * 1024
"""How far into an image its dimensions are looked for; a JPEG's size can sit behind large EXIF data."""


def image_tokens(url: str, detail: str | None = None) -> int:
    """Tokens OpenAI charges for one `image_url` part.

    :param url: The part's URL: a `data:` URL whose header gives the size, or a remote URL.
    :param detail: The part's `detail`: `low`, `high` or `auto` (None means `auto`, charged as `high`).
    """
    if detail == "low":
        return BASE_TOKENS
    size = data_url_image_size(url)
    if size is None:
        return DEFAULT_IMAGE_TOKENS
    return tiled_image_tokens(*size)


def tiled_image_tokens(width: int, height: int) -> int:
    """Tokens for a `high` detail image of the given size, by OpenAI's tile formula."""
    if width <= 0 or height <= 0:
        return BASE_TOKENS
    fit = min(1.0, 2048 / max(width, height))
    scaled_width, scaled_height = width * fit, height * fit
    shrink = min(1.0, 768 / min(scaled_width, scaled_height))
    tiles = math.ceil(scaled_width * shrink / 512) * math.ceil(scaled_height * shrink / 512)
    return BASE_TOKENS + TILE_TOKENS * tiles


def data_url_image_size(url: str) -> tuple[int, int] | None:
    """The (width, height) of a base64 `data:` image URL, read from its header; None when it cannot be read."""
    if not url.startswith("data:"):
        return None
    comma = url.find(",")
    if comma < 0 or ";base64" not in url[:comma]:
        return None
    payload = url[comma + 1 :]
    # Decode a growing prefix until the header is found: most formats need 30 bytes, a JPEG may need more.
    for prefix_bytes in (64, 4096, _MAX_HEADER_BYTES):
        chars = min(len(payload), prefix_bytes * 4 // 3) // 4 * 4
        try:
            head = base64.b64decode(payload[:chars], validate=False)
        except (binascii.Error, ValueError):
            return None
        size = image_size(head)
        if size is not None or chars >= len(payload) // 4 * 4:
            return size
    return None


def image_size(head: bytes) -> tuple[int, int] | None:
    """The (width, height) of a PNG, GIF, WebP or JPEG image from its first bytes; None when not recognized."""
    if head.startswith(b"\x89PNG\r\n\x1a\n") and len(head) >= 24:
        width, height = struct.unpack(">II", head[16:24])
        return width, height
    if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        width, height = struct.unpack("<HH", head[6:10])
        return width, height
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return _webp_size(head)
    if head[:2] == b"\xff\xd8":
        return _jpeg_size(head)
    return None


def _webp_size(head: bytes) -> tuple[int, int] | None:
    chunk = head[12:16]
    if chunk == b"VP8 " and len(head) >= 30:
        width, height = struct.unpack("<HH", head[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and len(head) >= 25:
        bits = int.from_bytes(head[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(head) >= 30:
        return int.from_bytes(head[24:27], "little") + 1, int.from_bytes(head[27:30], "little") + 1
    return None


_JPEG_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_size(head: bytes) -> tuple[int, int] | None:
    position = 2
    while position + 9 <= len(head):
        if head[position] != 0xFF:
            return None
        marker = head[position + 1]
        if marker == 0xFF:  # fill byte
            position += 1
            continue
        if marker in _JPEG_SOF_MARKERS:
            height, width = struct.unpack(">HH", head[position + 5 : position + 9])
            return width, height
        (length,) = struct.unpack(">H", head[position + 2 : position + 4])
        position += 2 + length
    return None
