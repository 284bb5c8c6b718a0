"""JSON minify: JSON tool results lose their insignificant whitespace, and nothing else.

Pretty-printed JSON spends a third or more of its tokens on indentation. Only whitespace between tokens goes: every
string, number, escape, key order and duplicate key stays byte for byte, so the result parses to exactly the same
data. Results that are not JSON objects or arrays, or that would not get smaller, are left as they are.
"""

from __future__ import annotations

import re

import orjson

from proxy.engine.strategies.text_rewrite import LosslessTextRewrite

_JSON_START = re.compile(r"[ \t\r\n]*[\[{]")
"""What a JSON object or array opens with; anything else is passed over without copying or parsing it."""

_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[^\s"]+', re.DOTALL)
"""A JSON text's strings (kept whole, whitespace and all) and the runs of everything else between whitespace."""


def minified(text: str) -> str | None:
    """`text` without the whitespace between its tokens when it is a JSON object or array and that makes it shorter."""
    if not _JSON_START.match(text):
        return None
    stripped = text.strip(" \t\r\n")
    try:
        orjson.loads(stripped)
    except orjson.JSONDecodeError:
        return None
    compact = "".join(_TOKENS.findall(stripped))
    return compact if len(compact) < len(text) else None


class JsonMinify(LosslessTextRewrite):
    """Re-serializes JSON tool results without insignificant whitespace, oldest first, until the target is met.

    Lossless: the rewritten result is marked `lossless`, so later strategies still treat it as the tool's output
    (pruning may prune it, a duplicate reference may point to it).
    """

    name = "json_minify"

    def rewrite(self, text: str) -> str | None:
        """`minified(text)`."""
        return minified(text)
