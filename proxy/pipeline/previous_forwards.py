"""What a wire format kept of how each conversation's latest request was forwarded, found again by its next one.

Some formats forward a request differently depending on what the conversation's previous request was sent as: the
Messages API binds each thinking block to everything sent before it, so which blocks may go back depends on what the
model saw (`Forwarding.replay_state`). The state is kept in this process, by the state scope and the last keys of the
client's message chain (`KEPT_AT`), and found by a later request whose chain extends them (looked up from its end, a
few turns back at most). It is bounded by count and by bytes (`forwarded_memory_bytes`: each state charged what the
format says it holds, `Forwarding.replay_bytes`, plus `ENTRY_BYTES`), least recently kept first out, and a state
costing more than a quarter of the bytes is not kept at all; a state not found (another replica forwarded the
previous request, or it was evicted) is forwarded without one, which the format makes valid on its own.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Final

CONVERSATIONS: Final = 4096
"""Conversations whose latest state is kept."""

KEPT_AT: Final = 2
"""A state is kept under the last two keys of its chain: a client that marks its newest message (a cache breakpoint
Claude Code moves every turn) sends it changed in the next request, which then extends the chain only up to the
message before it."""

ENTRY_BYTES: Final = 256
"""What keeping a state costs besides what it holds: its keys, their entries, the state's own object."""

LOOKBACK: Final = 64
"""Chain keys a lookup walks back from a request's end: more than one turn of any agent adds."""


class PreviousForwards:
    """The latest `replay_state` of each conversation (see the module docstring)."""

    def __init__(self, conversations: int = CONVERSATIONS, memory_bytes: int = 32 << 20, lookback: int = LOOKBACK):
        self.conversations = conversations
        self.memory_bytes = memory_bytes
        self.lookback = lookback
        self._states: OrderedDict[tuple[bytes, bytes], tuple[Any, int]] = OrderedDict()
        """Each state by the keys it is found by; charged to the last key only, the others cost 0 (the same object)."""
        self._bytes = 0

    def find(self, scope: bytes, chain: Sequence[bytes]) -> Any:
        """The state kept for the longest prefix of `chain` within `LOOKBACK` of its end, or None."""
        for key in reversed(chain[-self.lookback :]):
            kept = self._states.get((scope, key))
            if kept is not None:
                return kept[0]
        return None

    def remember(self, scope: bytes, chain: Sequence[bytes], state: Any, size: int = 0) -> None:
        """Keep `state` (holding `size` bytes) for the request whose chain is `chain`, replacing its earlier turns'.

        Nothing is kept when it is None or the chain empty; the earlier states go even when it costs too much.
        """
        if state is None or not chain:
            return
        for earlier in chain[-self.lookback :]:
            self._forget((scope, earlier))
        cost = size + ENTRY_BYTES
        if cost > self.memory_bytes // 4:
            return
        last = chain[-KEPT_AT:]
        for position, key in enumerate(last):
            self._states[scope, key] = (state, cost if position == len(last) - 1 else 0)
        self._bytes += cost
        while len(self._states) > self.conversations * KEPT_AT or self._bytes > self.memory_bytes:
            self._forget(next(iter(self._states)))

    def _forget(self, key: tuple[bytes, bytes]) -> None:
        kept = self._states.pop(key, None)
        if kept is not None:
            self._bytes -= kept[1]
