"""Middle-out truncation, the last resort: cut the middle out of the largest message so the request fits."""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from typing import Any

from proxy.engine.plan import Created, EditPlan
from proxy.engine.strategies.base import Strategy, replace_until_target
from proxy.engine.transcript import Transcript, created

DEFAULT_NOTICE = (
    "\n\n[... {removed_tokens} tokens were cut from the middle of this message to fit the context window ...]\n\n"
)

_NOTICE_RESERVE = 40
"""Tokens set aside for the notice itself when working out how much to cut."""


class MiddleOut(Strategy):
    """Cuts the middle out of the largest messages, keeping each one's head and tail, until the request fits.

    Earlier strategies remove whole turns and steps but never the instructions, the latest user message or the newest
    steps. When those alone still exceed the target (one enormous tool result, a pasted log), this cuts the middle of
    the single largest message other than the protected ones (the leading block and the latest user message, which
    stay byte for byte), and says in it how much was removed; if that is not enough, the next largest follows. The
    start and end of a text usually carry its framing and its conclusion, which is why the middle goes.

    :param min_keep_tokens: The fewest tokens of a cut message's text to keep (half at each end).
    :param notice: The text put where the middle was; `{removed_tokens}` is substituted.
    :raises ValueError: If `min_keep_tokens` is negative.
    """

    name = "middle_out"

    def __init__(self, *, min_keep_tokens: int = 256, notice: str = DEFAULT_NOTICE) -> None:
        if min_keep_tokens < 0:
            raise ValueError(f"`min_keep_tokens` must be at least 0, got {min_keep_tokens}.")
        self.min_keep_tokens = min_keep_tokens
        self.notice = notice

    def _propose(self, transcript: Transcript, target_tokens: int) -> EditPlan | None:
        candidates = _largest_first(transcript)
        return replace_until_target(
            transcript, target_tokens, candidates, lambda index, excess: self._cut(transcript, index, excess)
        )

    def _cut(self, transcript: Transcript, index: int, excess: int) -> Created | None:
        return cut_middle_out(
            transcript, index, excess, strategy=self.name, min_keep_tokens=self.min_keep_tokens, notice=self.notice
        )


def cut_middle_out(
    transcript: Transcript, index: int, excess: int, *, strategy: str, min_keep_tokens: int, notice: str
) -> Created | None:
    """The message at `index` with the middle of its largest text cut out, about `excess` tokens smaller, or None.

    The cut keeps at least `min_keep_tokens` of the text (half at each end) and puts `notice` (`{removed_tokens}`
    substituted) where the middle was; the created message is marked by `strategy` with the `removed_tokens`. None
    when the message has no text, or the text is already no longer than what would be kept.
    """
    message = transcript.messages[index]
    location = _largest_text(message)
    if location is None:
        return None
    text, rebuild = location
    counter = transcript.counter
    text_tokens = counter.text_tokens(text)
    keep = max(text_tokens - excess - _NOTICE_RESERVE, min_keep_tokens)
    if keep >= text_tokens:
        return None
    head, tail = counter.cut_middle(text, keep)
    removed = text_tokens - counter.text_tokens(head) - counter.text_tokens(tail)
    return created(
        rebuild(head + notice.replace("{removed_tokens}", str(removed)) + tail),
        strategy,
        replacing=index,
        base_meta=transcript.meta[index],
        removed_tokens=removed,
    )


def _largest_first(transcript: Transcript) -> Iterator[int]:
    """Message indices, largest first (oldest first among equals).

    A heap, not a sort: a conversation of a million messages needs only its few largest, so the order costs
    O(n + k log n) for the k taken.
    """
    heap = [(-transcript.tokens(index), index) for index in range(len(transcript))]
    heapq.heapify(heap)
    while heap:
        yield heapq.heappop(heap)[1]


def _largest_text(message: Mapping[str, Any]) -> tuple[str, Any] | None:
    """The message's largest text and a function rebuilding the message around a replacement for it."""
    content = message.get("content")
    if isinstance(content, str) and content:
        return content, lambda text: {**message, "content": text}
    if not isinstance(content, list):
        return None
    texts = [
        (len(part["text"]), position, part["text"])
        for position, part in enumerate(content)
        if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)
    ]
    if not texts:
        return None
    size, position, text = max(texts, key=lambda item: (item[0], -item[1]))
    if not size:
        return None

    def rebuild(new_text: str) -> dict[str, Any]:
        parts = list(content)
        parts[position] = {**parts[position], "text": new_text}
        return {**message, "content": parts}

    return text, rebuild
