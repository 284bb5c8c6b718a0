"""Duplicate results: an older tool result identical to a later one becomes a short reference to the later call."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import orjson

from proxy.engine.strategies.json_minify import minified
from proxy.engine.strategies.references import ResultReferences
from proxy.engine.strategies.repeated_lines import collapsed
from proxy.engine.strategies.text_rewrite import rewritten_content
from proxy.engine.transcript import Transcript

DEFAULT_REFERENCE = "[Same result as the later call `{tool_name}` ({call_id}) below.]"
"""Short on purpose: the call id it must name costs as much as the rest (26 tokens for an OpenAI id)."""


class DuplicateResults(ResultReferences):
    """Replaces every older copy of a tool result with a reference to its newest copy: nothing is lost.

    A copy is the same text, JSON that differs only in insignificant whitespace (the same data, as `json_minify`
    keeps it), or the same lines with their repeats written once (as `repeated_lines` keeps them).

    Agents re-read the same file, re-list the same directory, re-run the same query. Each copy after the first adds
    tokens and no information; the newest stays, next to what the model did with it.

    :param reference: The text left in place of an older copy; `{tool_name}` and `{call_id}` name the later call.
    """

    name = "duplicate_results"

    def __init__(self, *, reference: str = DEFAULT_REFERENCE) -> None:
        super().__init__(reference)

    def _key(self, transcript: Transcript, index: int, call: Mapping[str, Any] | None) -> Hashable | None:
        # A copy rewritten losslessly by an earlier compaction (replayed turn after turn) still matches the copy as
        # the tool returned it later: both are compared in their rewritten form.
        content = transcript.messages[index].get("content")
        if isinstance(content, str):
            return _rewritten(content)
        if isinstance(content, list):
            return orjson.dumps(rewritten_content(content, _rewritten) or content)
        return None


def _rewritten(text: str) -> str:
    """`text` as the lossless rewrites leave it: JSON minified, or repeated lines written once."""
    return minified(text) or collapsed(text) or text
