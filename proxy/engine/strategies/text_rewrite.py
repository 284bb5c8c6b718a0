"""Lossless text rewrites: each text of a tool result rewritten on its own, and the result marked as still whole."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

from proxy.engine.plan import Created, EditPlan
from proxy.engine.strategies.base import Strategy, replace_until_target
from proxy.engine.tool_results import LOSSLESS, holds_result
from proxy.engine.transcript import Transcript, created


class LosslessTextRewrite(Strategy):
    """Rewrites the text of tool results, oldest first, until the target is met, without losing anything.

    A result is rewritten only when `rewrite` changes one of its texts (the string content, or the `text` of each text
    part), and kept only when that saves tokens. The rewritten result is marked `lossless`, so later strategies still
    treat it as the tool's output (pruning may prune it, offloading may offload it, a duplicate reference may point to
    it). Only tool results are rewritten: never the user's messages nor the leading instructions.
    """

    @abstractmethod
    def rewrite(self, text: str) -> str | None:
        """`text` rewritten without losing anything, or None when this rewrite does not apply or does not shorten it."""

    def _propose(self, transcript: Transcript, target_tokens: int) -> EditPlan | None:
        candidates = (index for index in range(len(transcript)) if holds_result(transcript, index))
        return replace_until_target(
            transcript, target_tokens, candidates, lambda index, _excess: self._rewritten(transcript, index)
        )

    def _rewritten(self, transcript: Transcript, index: int) -> Created | None:
        message = transcript.messages[index]
        content = rewritten_content(message.get("content"), self.rewrite)
        if content is None:
            return None
        return created(
            {**message, "content": content},
            self.name,
            replacing=index,
            base_meta=transcript.meta[index],
            **{LOSSLESS: True},
        )


def rewritten_content(content: Any, rewrite: Callable[[str], str | None]) -> str | list[Any] | None:
    """The content with each text rewritten (a string, or the `text` of each text part), or None if none was."""
    if isinstance(content, str):
        return rewrite(content)
    if not isinstance(content, list):
        return None
    parts: list[Any] = []
    changed = False
    for part in content:
        text = part.get("text") if isinstance(part, Mapping) and part.get("type") == "text" else None
        new = rewrite(text) if isinstance(text, str) else None
        parts.append(part if new is None else {**part, "text": new})
        changed = changed or new is not None
    return parts if changed else None
