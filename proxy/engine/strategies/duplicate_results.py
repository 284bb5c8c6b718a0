"""Duplicate results: an older tool result identical to a later one becomes a short reference to the later call."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import orjson

from proxy.engine.strategies.json_minify import minified, minified_content
from proxy.engine.strategies.references import ResultReferences
from proxy.engine.transcript import Transcript

DEFAULT_REFERENCE = "[Same result as the later call `{tool_name}` ({call_id}) below.]"
"""Short on purpose: the call id it must name costs as much as the rest (26 tokens for an OpenAI id)."""


class DuplicateResults(ResultReferences):
    """Replaces every older copy of a tool result with a reference to its newest copy: nothing is lost.

    A copy is the same text, or JSON that differs only in insignificant whitespace (the same data, as `json_minify`
    keeps it).

    Agents re-read the same file, re-list the same directory, re-run the same query. Each copy after the first adds
    tokens and no information; the newest stays, next to what the model did with it.

    :param reference: The text left in place of an older copy; `{tool_name}` and `{call_id}` name the later call.
    """

    name = "duplicate_results"

    def __init__(self, *, reference: str = DEFAULT_REFERENCE) -> None:
        super().__init__(reference)

    def _key(self, transcript: Transcript, index: int, call: Mapping[str, Any] | None) -> Hashable | None:
        # JSON that differs only in whitespace is the same result: a copy minified by an earlier compaction still
        # matches the pretty-printed copy that came after it.
        content = transcript.messages[index].get("content")
        if isinstance(content, str):
            return minified(content) or content
        if isinstance(content, list):
            return orjson.dumps(minified_content(content) or content)
        return None
