"""JSON minify: JSON tool results lose their insignificant whitespace, and nothing else.

Pretty-printed JSON spends a third or more of its tokens on indentation. Only whitespace between tokens goes: every
string, number, escape, key order and duplicate key stays byte for byte, so the result parses to exactly the same
data. Results that are not JSON objects or arrays, or that would not get smaller, are left as they are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from proxy.engine.plan import Created, EditPlan
from proxy.engine.strategies.base import Strategy, replace_until_target
from proxy.engine.tool_results import LOSSLESS, holds_result
from proxy.engine.transcript import Transcript, created

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


class JsonMinify(Strategy):
    """Re-serializes JSON tool results without insignificant whitespace, oldest first, until the target is met.

    Lossless: the rewritten result is marked `lossless`, so later strategies still treat it as the tool's output
    (pruning may prune it, a duplicate reference may point to it).
    """

    name = "json_minify"

    def _propose(self, transcript: Transcript, target_tokens: int) -> EditPlan | None:
        candidates = (index for index in range(len(transcript)) if holds_result(transcript, index))
        return replace_until_target(
            transcript, target_tokens, candidates, lambda index, _excess: self._minified(transcript, index)
        )

    def _minified(self, transcript: Transcript, index: int) -> Created | None:
        message = transcript.messages[index]
        content = minified_content(message.get("content"))
        if content is None:
            return None
        return created(
            {**message, "content": content},
            self.name,
            replacing=index,
            base_meta=transcript.meta[index],
            **{LOSSLESS: True},
        )


def minified_content(content: Any) -> str | list[Any] | None:
    """The content with each JSON text minified (a string, or the `text` of each text part), or None if none was."""
    if isinstance(content, str):
        return minified(content)
    if not isinstance(content, list):
        return None
    parts: list[Any] = []
    changed = False
    for part in content:
        text = part.get("text") if isinstance(part, Mapping) and part.get("type") == "text" else None
        compact = minified(text) if isinstance(text, str) else None
        parts.append(part if compact is None else {**part, "text": compact})
        changed = changed or compact is not None
    return parts if changed else None
