"""The wire formats the proxy compacts, one folder each, and which format a request path is.

Each folder implements `proxy.pipeline.wire.WireFormat`; `FORMATS` registers them. A format is added by its folder
and one entry here.
"""

from __future__ import annotations

from typing import Final

import orjson

from proxy.formats.anthropic.wire import MESSAGES
from proxy.formats.chat_completions.wire import CHAT_COMPLETIONS
from proxy.formats.responses.wire import RESPONSES
from proxy.pipeline.wire import WireFormat

FORMATS: Final[tuple[WireFormat, ...]] = (CHAT_COMPLETIONS, RESPONSES, MESSAGES)
"""Every wire format the proxy compacts, in the order paths are matched."""


def format_of_body(raw: bytes) -> WireFormat:
    """The wire format a request body is read as when no path tells: the first that recognizes it, else the first."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return FORMATS[0]
    recognized = (wire for wire in FORMATS if isinstance(body, dict) and wire.recognizes(body))
    return next(recognized, FORMATS[0])


def format_of(method: str, path: str) -> WireFormat | None:
    """The wire format of a request compaction sees (a POST to one of the formats' paths), or None."""
    if method != "POST":
        return None
    return next((wire for wire in FORMATS if wire.serves(path)), None)
