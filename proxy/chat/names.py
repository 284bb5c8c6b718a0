"""Client-chosen names (models, conversation ids) as they may appear in logs: bounded and printable."""

from __future__ import annotations

from typing import Final

MAX_SHOWN: Final = 128
"""Longest name shown in a log line, in characters; longer ones are cut and marked."""


def shown(name: str | None, limit: int = MAX_SHOWN) -> str | None:
    """`name` fit for a log line: at most `limit` printable characters, `...` marking a cut; None stays None."""
    if name is None:
        return None
    printable = "".join(char for char in name[:limit] if char.isprintable())
    return printable + "..." if len(name) > limit else printable
