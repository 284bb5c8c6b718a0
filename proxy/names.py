"""Client-chosen names (models, conversation ids) as they may appear in logs: bounded and printable."""

from __future__ import annotations

from typing import Final

from xxhash import xxh3_128_digest

MAX_SHOWN: Final = 128
"""Longest name shown in a log line, in characters; longer ones are cut and marked."""


def shown(name: str | None, limit: int = MAX_SHOWN) -> str | None:
    """`name` fit for a log line: at most `limit` printable characters, `...` marking a cut; None stays None."""
    if name is None:
        return None
    if len(name) <= limit and name.isprintable():
        return name  # the common name, shown as it is without a character-by-character copy
    printable = "".join(char for char in name[:limit] if char.isprintable())
    return printable + "..." if len(name) > limit else printable


def name_key(name: str | None) -> bytes:
    """A fixed-size key for a client-chosen name, so tables keyed by it stay small whatever the name's length."""
    return xxh3_128_digest((name or "").encode("utf-8", "surrogatepass"))
