"""Message keys without rehashing what the proxy has already seen: the previous request's prefix is reused.

A client re-sends its whole conversation every turn. Hashing every message of a 2 MB conversation costs several
milliseconds of Python per request, while comparing it with the previous request's parsed messages is a single
C-level list comparison. So the proxy remembers, per conversation, the messages of the last request and their keys;
when a new request starts with exactly those messages, their keys are reused and only the new ones are hashed.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from proxy.engine.messages import Message, MessageKey, chain_keys, message_key

DEFAULT_MAX_CONVERSATIONS = 1_000
"""Conversations whose last request is remembered; the least recently seen go first."""

_CANDIDATES_PER_OPENING = 4
"""Conversations remembered per opening message (many runs of one agent share their system prompt)."""


@dataclass(frozen=True)
class _Seen:
    """The messages of a conversation's last request, their keys and the hash chain of those keys."""

    messages: list[Message]
    keys: list[MessageKey]
    chain: list[bytes]


class KnownPrefixes:
    """Computes message keys, reusing those of the longest remembered request that the new one extends.

    :param max_conversations: How many conversations to remember; each holds a reference to its last request's
        parsed messages (no copy).
    """

    def __init__(self, max_conversations: int = DEFAULT_MAX_CONVERSATIONS) -> None:
        self._seen: OrderedDict[bytes, list[_Seen]] = OrderedDict()
        self._max = max_conversations
        self._lock = threading.Lock()

    def keys(self, tenant: bytes, messages: list[Message]) -> tuple[list[MessageKey], list[bytes]]:
        """Every message's key and the conversation's hash chain, hashing only what follows the remembered prefix."""
        if not messages:
            return [], []
        opening = tenant + message_key(messages[0])
        with self._lock:
            candidates = list(self._seen.get(opening, ()))
        reused = next((seen for seen in candidates if _extends(messages, seen.messages)), None)
        if reused is None:
            keys = [message_key(message) for message in messages]
            chain = chain_keys(keys)
        else:
            new_keys = [message_key(message) for message in messages[len(reused.keys) :]]
            keys = [*reused.keys, *new_keys]
            chain = [*reused.chain, *chain_keys(new_keys, start=reused.chain[-1])]
        self._remember(opening, _Seen(messages, keys, chain), replacing=reused)
        return keys, chain

    def _remember(self, opening: bytes, seen: _Seen, replacing: _Seen | None) -> None:
        with self._lock:
            candidates = self._seen.pop(opening, [])
            candidates = [other for other in candidates if other is not replacing][: _CANDIDATES_PER_OPENING - 1]
            self._seen[opening] = [seen, *candidates]
            while len(self._seen) > self._max:
                self._seen.popitem(last=False)


def _extends(messages: list[Message], known: list[Message]) -> bool:
    """Whether `messages` starts with exactly the `known` messages (one C-level comparison, last message first)."""
    return len(known) <= len(messages) and messages[len(known) - 1] == known[-1] and messages[: len(known)] == known
