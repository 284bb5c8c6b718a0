"""Message keys without rehashing what the proxy has already seen: the previous request's prefix is reused.

A client re-sends its whole conversation every turn. Hashing every message of a 2 MB conversation costs several
milliseconds of Python per request, while comparing it with the previous request's parsed messages is a single
C-level list comparison. So the proxy remembers, per conversation, the messages of the last request and their keys;
when a new request starts with exactly those messages, their keys are reused and only the new ones are hashed.

What is remembered is bounded in bytes as well as in conversations: clients choose how large their requests are, and
parsed messages held between requests would otherwise grow with what they send.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

import orjson

from proxy.engine.messages import Message, MessageKey, chain_keys, message_key

DEFAULT_MAX_CONVERSATIONS = 1_000
"""Conversations whose last request is remembered; the least recently seen go first."""

DEFAULT_MAX_BYTES = 64 * 2**20
"""What the remembered requests may cost in memory, all together (see `KnownPrefixes`)."""

LARGEST_SHARE = 4
"""A request costing more than `max_bytes / LARGEST_SHARE` is not remembered, so one cannot evict all the others."""

BYTES_PER_MESSAGE = 400
"""What one parsed message costs in memory beyond its text: the dict, its key and chain digests, list slots.

Measured with tracemalloc on one-word messages (about 380 bytes each beyond their JSON)."""

_CANDIDATES_PER_OPENING = 4
"""Conversations remembered per opening message (many runs of one agent share their system prompt)."""

T = TypeVar("T")


@dataclass(frozen=True)
class _Seen:
    """The messages of a conversation's last request, their keys, the hash chain of those keys, and what they cost."""

    messages: list[Message]
    keys: list[MessageKey]
    chain: list[bytes]
    cost: int


class RecentByOpening(Generic[T]):
    """The last requests of recent conversations, found by their opening, bounded in openings and in bytes.

    :param max_openings: How many openings to remember, each with the last requests of up to
        `_CANDIDATES_PER_OPENING` conversations; the least recently seen openings are forgotten first.
    :param max_bytes: What all remembered requests may cost together, as their owner charges them; the least
        recently seen openings are forgotten first to stay under it. A request costing more than a
        `1 / LARGEST_SHARE` of it is not remembered at all, so one cannot evict all the others.
    """

    def __init__(self, max_openings: int, max_bytes: int) -> None:
        self._seen: OrderedDict[bytes, list[tuple[T, int]]] = OrderedDict()
        self._max = max_openings
        self._max_bytes = max_bytes
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def cost(self) -> int:
        """What the remembered requests cost now, as charged."""
        return self._bytes

    def openings(self) -> set[bytes]:
        """The openings remembered now."""
        with self._lock:
            return set(self._seen)

    def candidates(self, opening: bytes) -> list[T]:
        """The requests remembered under `opening`, most recent first."""
        with self._lock:
            return [item for item, _cost in self._seen.get(opening, ())]

    def admits(self, cost: int) -> bool:
        """Whether a request costing `cost` would be remembered (so one too large is not worked on for it)."""
        return cost <= self._max_bytes // LARGEST_SHARE

    def remember(self, opening: bytes, item: T, cost: int, replacing: T | None = None) -> None:
        """Remember `item` first under `opening`, in place of `replacing` (the request it extends), if remembered."""
        if not self.admits(cost):
            return
        with self._lock:
            candidates = self._seen.pop(opening, [])
            others = [other for other in candidates if other[0] is not replacing]
            kept = others[: _CANDIDATES_PER_OPENING - 1]
            self._seen[opening] = [(item, cost), *kept]
            self._bytes += cost + sum(other_cost for _other, other_cost in kept)
            self._bytes -= sum(other_cost for _other, other_cost in candidates)
            while len(self._seen) > self._max or self._bytes > self._max_bytes:
                _opening, forgotten = self._seen.popitem(last=False)
                self._bytes -= sum(other_cost for _other, other_cost in forgotten)


class KnownPrefixes:
    """Computes message keys, reusing those of the longest remembered request that the new one extends.

    :param max_conversations: How many openings (first messages, per tenant) to remember, each with the last
        requests of up to four conversations; each holds a reference to its request's parsed messages (no copy).
    :param max_bytes: What all remembered requests may cost together, each charged its body size plus
        `BYTES_PER_MESSAGE` per message (see `RecentByOpening`).
    """

    def __init__(self, max_conversations: int = DEFAULT_MAX_CONVERSATIONS, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._seen: RecentByOpening[_Seen] = RecentByOpening(max_conversations, max_bytes)

    @property
    def cost(self) -> int:
        """What the remembered requests cost now, as charged."""
        return self._seen.cost

    def keys(
        self, tenant: bytes, messages: list[Message], body_bytes: int | None = None
    ) -> tuple[list[MessageKey], list[bytes]]:
        """Every message's key and the conversation's hash chain, hashing only what follows the remembered prefix.

        :param body_bytes: The size of the request body the messages were parsed from (an upper bound on their
            text). When None, the messages not reused are serialized to measure it, which costs about as much as
            hashing them.
        """
        if not messages:
            return [], []
        opening = tenant + message_key(messages[0])
        candidates = self._seen.candidates(opening)
        reused = next((seen for seen in candidates if _extends(messages, seen.messages)), None)
        if reused is None:
            keys = [message_key(message) for message in messages]
            chain = chain_keys(keys)
            measured = _text_bytes(messages) if body_bytes is None else body_bytes
        else:
            added = messages[len(reused.keys) :]
            keys, chain = extended_keys(reused.keys, reused.chain, added)
            measured = reused.cost + _text_bytes(added) if body_bytes is None else body_bytes
        cost = measured + BYTES_PER_MESSAGE * len(messages)
        self._seen.remember(opening, _Seen(messages, keys, chain, cost), cost, replacing=reused)
        return keys, chain


def extended_keys(
    keys: list[MessageKey], chain: list[bytes], added: list[Message]
) -> tuple[list[MessageKey], list[bytes]]:
    """The keys and chain of a conversation (`keys`, `chain`, not empty) continued by `added`: only those are hashed."""
    new_keys = [message_key(message) for message in added]
    return [*keys, *new_keys], [*chain, *chain_keys(new_keys, start=chain[-1])]


def _extends(messages: list[Message], known: list[Message]) -> bool:
    """Whether `messages` starts with exactly the `known` messages (one C-level comparison, last message first)."""
    return len(known) <= len(messages) and messages[len(known) - 1] == known[-1] and messages[: len(known)] == known


def _text_bytes(messages: list[Message]) -> int:
    """The messages' size as JSON; a message that cannot be serialized counts as too large to remember."""
    try:
        return sum(len(orjson.dumps(message)) for message in messages)
    except TypeError:
        return 2**62
