"""The wire formats the proxy compacts, one folder each, and which format a request path is.

Each folder implements `proxy.pipeline.wire.WireFormat`; `FORMATS` registers them. A format is added by its folder
and one entry here.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Final

import orjson

from proxy.formats.anthropic.wire import MESSAGES
from proxy.formats.chat_completions.wire import CHAT_COMPLETIONS
from proxy.formats.responses.wire import RESPONSES
from proxy.pipeline.wire import WireFormat

FORMATS: Final[tuple[WireFormat, ...]] = (CHAT_COMPLETIONS, RESPONSES, MESSAGES)
"""Every wire format the proxy compacts, in the order paths are matched."""


PATHS_REMEMBERED: Final = 1024
"""Paths whose format `format_of` remembers; a client's other paths are matched again (correct, only slower)."""

BODY_ORDER: Final[tuple[WireFormat, ...]] = (MESSAGES, RESPONSES, CHAT_COMPLETIONS)
"""The order a body with no path to tell is recognized in: the most specific format first; chat completions, which
any body with `messages` could be, last, and the default."""


def api_of(method: str, path: str, headers: Mapping[str, str]) -> WireFormat | None:
    """The wire format whose API a request speaks, for the shape of the proxy's own errors.

    That is the format it is of, else the one whose `api_headers` it carries (another endpoint of that API, passed
    through), else None.
    """
    wire = format_of(method, path)
    if wire is not None:
        return wire
    return next((wire for wire in FORMATS if any(name in headers for name in wire.api_headers)), None)


def format_of_body(raw: bytes) -> WireFormat:
    """The wire format a request body is read as when no path tells (a file on the command line; `BODY_ORDER`)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return CHAT_COMPLETIONS
    recognized = (wire for wire in BODY_ORDER if isinstance(body, dict) and wire.recognizes(body))
    return next(recognized, CHAT_COMPLETIONS)


def counting_format(method: str, path: str) -> WireFormat | None:
    """The wire format whose prompt-counting endpoint a request is for (a POST there: `WireFormat.prompt_counting`)."""
    if method != "POST":
        return None
    return _counting_at(path)


@lru_cache(maxsize=PATHS_REMEMBERED)
def _counting_at(path: str) -> WireFormat | None:
    """The format whose prompt-counting endpoint serves POSTs to `path` (asked of every request not compacted)."""
    return next((wire for wire in FORMATS if wire.prompt_counting and wire.prompt_counting.serves(path)), None)


def format_of(method: str, path: str) -> WireFormat | None:
    """The wire format of a request compaction sees (a POST to one of the formats' paths), or None."""
    if method != "POST":
        return None
    return _format_at(path)


@lru_cache(maxsize=PATHS_REMEMBERED)
def _format_at(path: str) -> WireFormat | None:
    """The format serving POSTs to `path` (asked several times per request: by the access line, routing, the route)."""
    return next((wire for wire in FORMATS if wire.serves(path)), None)
