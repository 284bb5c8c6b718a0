"""What a wire format kept of how each conversation's latest request was forwarded, found again by its next one.

Some formats forward a request differently depending on what the conversation's previous request was sent as: the
Messages API binds each thinking block to everything sent before it, so which blocks may go back depends on what the
model saw (`Forwarding.replay_state`). The state is kept in this process, by the state scope and the last keys of the
client's message chain (`KEPT_AT`), and found by a later request whose chain extends them (looked up from its end, a
few turns back at most). It is bounded by count, oldest first out; a state not found (another replica forwarded the
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

LOOKBACK: Final = 64
"""Chain keys a lookup walks back from a request's end: more than one turn of any agent adds."""


class PreviousForwards:
    """The latest `replay_state` of each conversation (see the module docstring)."""

    def __init__(self, conversations: int = CONVERSATIONS, lookback: int = LOOKBACK) -> None:
        self.conversations = conversations
        self.lookback = lookback
        self._states: OrderedDict[tuple[bytes, bytes], Any] = OrderedDict()

    def find(self, scope: bytes, chain: Sequence[bytes]) -> Any:
        """The state kept for the longest prefix of `chain` within `LOOKBACK` of its end, or None."""
        for key in reversed(chain[-self.lookback :]):
            state = self._states.get((scope, key))
            if state is not None:
                return state
        return None

    def remember(self, scope: bytes, chain: Sequence[bytes], state: Any) -> None:
        """Keep `state` for the request whose client chain is `chain`, in place of its earlier turns' states.

        Nothing is kept when it is None or the chain empty.
        """
        if state is None or not chain:
            return
        for earlier in chain[-self.lookback : -KEPT_AT]:
            self._states.pop((scope, earlier), None)
        for last in chain[-KEPT_AT:]:
            key = (scope, last)
            self._states[key] = state
            self._states.move_to_end(key)
        while len(self._states) > self.conversations * KEPT_AT:
            self._states.popitem(last=False)
