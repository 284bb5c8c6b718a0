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


@dataclass(frozen=True)
class _Seen:
    """The messages of a conversation's last request, their keys, the hash chain of those keys, and what they cost."""

    messages: list[Message]
    keys: list[MessageKey]
    chain: list[bytes]
    cost: int


class KnownPrefixes:
    """Computes message keys, reusing those of the longest remembered request that the new one extends.

    :param max_conversations: How many openings (first messages, per tenant) to remember, each with the last
        requests of up to four conversations; each holds a reference to its request's parsed messages (no copy).
    :param max_bytes: What all remembered requests may cost together, each charged its body size plus
        `BYTES_PER_MESSAGE` per message; the least recently seen openings are forgotten first to stay under it. A
        request costing more than a `1 / LARGEST_SHARE` of it is not remembered at all.
    """

    def __init__(self, max_conversations: int = DEFAULT_MAX_CONVERSATIONS, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._seen: OrderedDict[bytes, list[_Seen]] = OrderedDict()
        self._max = max_conversations
        self._max_bytes = max_bytes
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def cost(self) -> int:
        """What the remembered requests cost now, as charged."""
        return self._bytes

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
        with self._lock:
            candidates = list(self._seen.get(opening, ()))
        reused = next((seen for seen in candidates if _extends(messages, seen.messages)), None)
        if reused is None:
            keys = [message_key(message) for message in messages]
            chain = chain_keys(keys)
            measured = _text_bytes(messages) if body_bytes is None else body_bytes
        else:
            added = messages[len(reused.keys) :]
            new_keys = [message_key(message) for message in added]
            keys = [*reused.keys, *new_keys]
            chain = [*reused.chain, *chain_keys(new_keys, start=reused.chain[-1])]
            measured = reused.cost + _text_bytes(added) if body_bytes is None else body_bytes
        cost = measured + BYTES_PER_MESSAGE * len(messages)
        if cost <= self._max_bytes // LARGEST_SHARE:
            self._remember(opening, _Seen(messages, keys, chain, cost), replacing=reused)
        return keys, chain

    def _remember(self, opening: bytes, seen: _Seen, replacing: _Seen | None) -> None:
        with self._lock:
            candidates = self._seen.pop(opening, [])
            others = [other for other in candidates if other is not replacing]
            kept, dropped = others[: _CANDIDATES_PER_OPENING - 1], others[_CANDIDATES_PER_OPENING - 1 :]
            if replacing is not None and len(others) < len(candidates):
                dropped.append(replacing)
            self._seen[opening] = [seen, *kept]
            self._bytes += seen.cost - sum(other.cost for other in dropped)
            while len(self._seen) > self._max or self._bytes > self._max_bytes:
                _opening, forgotten = self._seen.popitem(last=False)
                self._bytes -= sum(other.cost for other in forgotten)


def _extends(messages: list[Message], known: list[Message]) -> bool:
    """Whether `messages` starts with exactly the `known` messages (one C-level comparison, last message first)."""
    return len(known) <= len(messages) and messages[len(known) - 1] == known[-1] and messages[: len(known)] == known


def _text_bytes(messages: list[Message]) -> int:
    """The messages' size as JSON; a message that cannot be serialized counts as too large to remember."""
    try:
        return sum(len(orjson.dumps(message)) for message in messages)
    except TypeError:
        return 2**62
