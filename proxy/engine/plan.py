"""Edit plans: what a compaction does to a conversation, without copying or touching it.

A compactor does not return new messages; it returns an `EditPlan` listing, in order, what the compacted
conversation holds: original messages it keeps (`Kept`), and messages it creates (`Created`) — either in place of one
original (a pruned tool result, a cut-down message) or inserted (an omission note, a summary). Each front end applies
the plan to its own objects: the proxy to request dicts, the Haystack hook to the caller's own `ChatMessage`s, so
every message that survives is the caller's object, metadata intact.

Plans compose (`then`): the proxy remembers one plan per conversation prefix and stacks each later compaction on it,
so the upstream receives the same rewritten prefix turn after turn.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from proxy.engine.messages import Message

COMPACTION_META_KEY = "context_compaction"
"""Meta key marking a message compaction created; its value is a dict with at least the `strategy` name.

The same key Haystack's own compactors use, so each side recognizes the other's notes and summaries.
"""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Kept:
    """An original message that survives unchanged: `index` is its position in the plan's source."""

    index: int


@dataclass(frozen=True, slots=True)
class Created:
    """A message compaction created.

    :param message: The new message, an OpenAI Chat Completions dict.
    :param meta: Its metadata; always holds `COMPACTION_META_KEY` with the strategy that created it. A message that
        replaces an original carries the original's metadata too.
    :param replaces: The source index of the original this message stands in for, or None when it was inserted.
    """

    message: Message
    meta: Mapping[str, Any] = field(hash=False)
    replaces: int | None = None

    @property
    def strategy(self) -> str:
        """The strategy that created the message."""
        marker = self.meta.get(COMPACTION_META_KEY)
        return str(marker.get("strategy")) if isinstance(marker, Mapping) else ""


Entry = Kept | Created


@dataclass(frozen=True)
class EditPlan:
    """The compacted conversation, as a list of entries over a source conversation of `source_length` messages.

    :param read_tool: The conversation was sent with the proxy's read tool (it held an offloaded result): every later
        request of it is sent with the tool too, even once no reference is left, so that its tools, which every
        provider's prompt cache orders first, stay the same. Carried through `extended` and `then`.
    """

    source_length: int
    entries: tuple[Entry, ...]
    read_tool: bool = False

    @classmethod
    def identity(cls, length: int) -> EditPlan:
        """The plan that keeps every message of a conversation of `length` messages."""
        return cls(length, tuple(Kept(index) for index in range(length)))

    def __len__(self) -> int:
        return len(self.entries)

    def apply(self, source: Sequence[T], create: Callable[[Created, T | None], T]) -> list[T]:
        """Build the compacted conversation from the caller's own objects.

        :param source: The conversation the plan was made for (or one that extends it; see `extended`).
        :param create: Builds the caller's object for a created message, given the original it replaces, if any.
        """
        return [
            source[entry.index]
            if isinstance(entry, Kept)
            else create(entry, None if entry.replaces is None else source[entry.replaces])
            for entry in self.entries
        ]

    def apply_messages(self, source: Sequence[Message]) -> list[Message]:
        """The compacted conversation as OpenAI dicts: kept dicts are the source's own objects, not copies."""
        return self.apply(source, lambda created, _original: created.message)

    def extended(self, length: int) -> EditPlan:
        """The same plan over a conversation that grew to `length` messages: the appended ones are kept."""
        if length <= self.source_length:
            return self
        added = tuple(Kept(index) for index in range(self.source_length, length))
        return EditPlan(length, self.entries + added, self.read_tool)

    def then(self, later: EditPlan) -> EditPlan:
        """Compose: `later` is a plan over this plan's output; the result is one plan over this plan's source."""
        if later.source_length != len(self.entries):
            raise ValueError(
                f"Cannot compose: the later plan is over {later.source_length} messages, this one produces "
                f"{len(self.entries)}."
            )
        composed: list[Entry] = []
        for entry in later.entries:
            if isinstance(entry, Kept):
                composed.append(self.entries[entry.index])
            else:
                composed.append(Created(entry.message, entry.meta, self._source_index(entry.replaces)))
        return EditPlan(self.source_length, tuple(composed), self.read_tool or later.read_tool)

    def _source_index(self, output_index: int | None) -> int | None:
        if output_index is None:
            return None
        entry = self.entries[output_index]
        return entry.index if isinstance(entry, Kept) else entry.replaces

    @property
    def is_identity(self) -> bool:
        """Whether the plan keeps every source message, in order, and creates nothing."""
        return len(self.entries) == self.source_length and all(
            isinstance(entry, Kept) and entry.index == position for position, entry in enumerate(self.entries)
        )

    def kept_indices(self) -> set[int]:
        """Source indices of the messages kept unchanged."""
        return {entry.index for entry in self.entries if isinstance(entry, Kept)}

    def created(self) -> list[Created]:
        """The messages compaction created, in order."""
        return [entry for entry in self.entries if isinstance(entry, Created)]

    def removed_count(self) -> int:
        """How many source messages neither survive nor are stood in for by a replacement."""
        replaced = {entry.replaces for entry in self.created() if entry.replaces is not None}
        return self.source_length - len(self.kept_indices() | replaced)
