"""The conversation as compactors see it: messages, their metadata, and their token counts, counted once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from proxy.engine.counting import TokenCounter
from proxy.engine.messages import Message, MessageKey
from proxy.engine.plan import COMPACTION_META_KEY, Created, EditPlan, Kept

_NO_META: Mapping[str, Any] = {}


class Counts(NamedTuple):
    """The counts a transcript made, handed to the transcript of the conversation's next request, which extends it.

    :param tokens: By position; None where not counted.
    :param summed: How many leading messages were summed, and their sum, so the next transcript sums only past them.
    """

    tokens: list[int | None]
    summed: tuple[int, int] = (0, 0)

    def extended(self, length: int) -> Counts:
        """The counts for a conversation extended to `length` messages: the new ones not counted yet."""
        return Counts([*self.tokens, *[None] * (length - len(self.tokens))], self.summed)


class Transcript:
    """A read-only view of a conversation with lazily counted, remembered per-message token counts.

    :param messages: The conversation, oldest first, as OpenAI dicts. Never modified.
    :param counter: Measures each message (once per transcript; the counter caches across transcripts too).
    :param meta: Per-message metadata from the front end: the Haystack hook passes each `ChatMessage.meta`, the
        proxy the markers of the messages its earlier compactions created. Compactors recognize their own (and
        Haystack's) notes and summaries by `COMPACTION_META_KEY`.
    :param tokens: Counts already known, by position (None where unknown).
    :param keys: The messages' keys when the caller already computed them, so counting does not hash again.
    :param summed: How many leading messages `tokens` already holds the sum of, and that sum (see `Counts`).
    :param counted_bounds: Bound a message already counted by its count. The Haystack hook does, with the counts it
        keeps per message. The proxy does not: its counts come from the last turn when it recognized the request, and
        a bound built from them would make the same request reported differently by a process that did not.
    """

    __slots__ = ("_counted_bounds", "_keys", "_summed", "_tokens", "counter", "messages", "meta")

    def __init__(
        self,
        messages: Sequence[Message],
        counter: TokenCounter,
        meta: Sequence[Mapping[str, Any]] | None = None,
        tokens: Sequence[int | None] | None = None,
        keys: Sequence[MessageKey] | None = None,
        *,
        summed: tuple[int, int] = (0, 0),
        counted_bounds: bool = True,
    ) -> None:
        if meta is not None and len(meta) != len(messages):
            raise ValueError(f"Got {len(meta)} metadata entries for {len(messages)} messages.")
        if not 0 <= summed[0] <= len(messages) or (summed[0] and tokens is None):
            raise ValueError(f"A sum over {summed[0]} messages does not fit {len(messages)} counted messages.")
        self.messages = messages
        self.counter = counter
        self.meta: Sequence[Mapping[str, Any]] = meta if meta is not None else [_NO_META] * len(messages)
        self._tokens: list[int | None] = list(tokens) if tokens is not None else [None] * len(messages)
        self._keys = keys
        self._summed = summed
        self._counted_bounds = counted_bounds

    def __len__(self) -> int:
        return len(self.messages)

    def tokens(self, index: int) -> int:
        """Tokens of the message at `index`."""
        count = self._tokens[index]
        if count is None:
            key = self._keys[index] if self._keys is not None else None
            count = self._tokens[index] = self.counter.message_tokens(self.messages[index], key)
        return count

    def counts(self) -> Counts:
        """The counts made so far, for the transcript of a request extending this one."""
        return Counts(list(self._tokens), self._summed)

    def upper_bound(self, index: int) -> int:
        """A bound no smaller than `tokens(index)`: the count when known and `counted_bounds`, else the cheap bound."""
        count = self._tokens[index] if self._counted_bounds else None
        if count is not None:
            return count
        key = self._keys[index] if self._keys is not None else None
        return self.counter.message_upper_bound(self.messages[index], key)

    def tokens_of(self, indices: Iterable[int]) -> int:
        """Tokens of the messages at `indices`."""
        return sum(self.tokens(index) for index in indices)

    def prefix_tokens(self, stop: int) -> int:
        """Tokens of the first `stop` messages, summing only past the longest prefix already summed.

        An agent's conversation is anchored and calibrated on its whole known prefix every turn: summed once, that
        costs the new messages only.
        """
        known, total = self._summed
        if stop < known:
            return self.tokens_of(range(stop))
        total += self.tokens_of(range(known, stop))
        self._summed = (stop, total)
        return total

    def total(self) -> int:
        """Tokens of all messages (without the request's fixed overhead), summed once: strategies ask repeatedly."""
        return self.prefix_tokens(len(self.messages))

    def role(self, index: int) -> str:
        """The role of the message at `index`."""
        role = self.messages[index].get("role")
        return role if isinstance(role, str) else ""

    def marker(self, index: int) -> Mapping[str, Any] | None:
        """The compaction marker of the message at `index`, or None when compaction did not create it."""
        marker = self.meta[index].get(COMPACTION_META_KEY)
        return marker if isinstance(marker, Mapping) else None

    def created_by(self, index: int, strategy: str) -> bool:
        """Whether `strategy` created the message at `index`."""
        marker = self.marker(index)
        return marker is not None and marker.get("strategy") == strategy

    def edited(self, plan: EditPlan) -> Transcript:
        """The transcript the plan produces, keeping the counts already known for the messages it keeps."""
        messages: list[Message] = []
        meta: list[Mapping[str, Any]] = []
        tokens: list[int | None] = []
        for entry in plan.entries:
            if isinstance(entry, Kept):
                messages.append(self.messages[entry.index])
                meta.append(self.meta[entry.index])
                tokens.append(self._tokens[entry.index])
            else:
                messages.append(entry.message)
                meta.append(entry.meta)
                tokens.append(None)
        return Transcript(messages, self.counter, meta, tokens, counted_bounds=self._counted_bounds)


def created(
    message: Message,
    strategy: str,
    *,
    replacing: int | None = None,
    base_meta: Mapping[str, Any] | None = None,
    **details: Any,
) -> Created:
    """A `Created` entry marked with `strategy` and its details, carrying over `base_meta` (a replaced message's)."""
    marker = {"strategy": strategy, **details}
    return Created(message=message, meta={**(base_meta or {}), COMPACTION_META_KEY: marker}, replaces=replacing)


def plan_of(transcript: Transcript, entries: Sequence[Kept | Created]) -> EditPlan:
    """An edit plan over `transcript`."""
    return EditPlan(len(transcript), tuple(entries))
