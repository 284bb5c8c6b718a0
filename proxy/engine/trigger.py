"""When to compact, and to what size: the one decision the proxy and the hook share.

The estimate anchors on what the provider reported: its count for a prefix of the conversation (which already
includes the system prompt, tool schemas and chat-template overhead as the provider sees them) plus a local count of
the messages appended since. With no report, everything is counted locally. Compaction starts when the estimate
reaches `compact_at` of the window and aims at `compact_to` of it, less what is not messages.

A request that reserves room for its reply (`max_tokens`, `max_completion_tokens`, `max_output_tokens`) leaves only
the rest of the window for its prompt, and providers reject a prompt that does not leave that room: the trigger is
then the room itself when that is lower, and the target shrinks in proportion.

A client that compacts its conversation itself (`client_compacts`) is not raced: the trigger is then the room, so
compaction happens only as the safety net, for a prompt the provider would refuse; the target stays where it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from proxy.engine.transcript import Transcript


@dataclass(frozen=True)
class Thresholds:
    """The window and the two fractions of it that drive compaction.

    :param context_window: The model's context window in tokens.
    :param compact_at: The fraction of the window at which compaction starts. Leave room above it for the reply and
        the tool results it triggers, which land on top of what was measured.
    :param compact_to: The fraction of the window compaction brings the conversation down to. Lower means compacting
        less often but losing more each time.
    :param reserved_tokens: The tokens the request reserves for its reply; ignored unless less than the window.
    :param client_compacts: The client compacts its conversation itself: compact only when the prompt would not fit
        (reaches the room), never at `compact_at`.
    :raises ValueError: If `context_window` is not positive or the fractions are not `0 < compact_to < compact_at <= 1`.
    """

    context_window: int
    compact_at: float = 0.7
    compact_to: float = 0.4
    reserved_tokens: int = 0
    client_compacts: bool = False

    def __post_init__(self) -> None:
        if self.context_window < 1:
            raise ValueError(f"`context_window` must be a positive number of tokens, got {self.context_window}.")
        if not 0 < self.compact_to < self.compact_at <= 1:
            raise ValueError(
                f"`compact_at` and `compact_to` must satisfy 0 < compact_to < compact_at <= 1, got "
                f"compact_at={self.compact_at} and compact_to={self.compact_to}. A target at or above the trigger "
                f"would leave the conversation over the trigger after compacting, so it would be attempted again "
                f"every step."
            )

    @cached_property
    def room(self) -> int:
        """What the prompt may fill: the window, less the reply's reservation when that leaves anything."""
        reserved = self.reserved_tokens if 0 < self.reserved_tokens < self.context_window else 0
        return self.context_window - reserved

    @cached_property
    def reservation_decides(self) -> bool:
        """Whether the reply's reservation, not `compact_at`, sets the trigger."""
        return self.room < self.context_window * self.compact_at

    @cached_property
    def trigger_tokens(self) -> float:
        """The estimate at which compaction starts: `compact_at` of the window, or the room left by the reply.

        For a client that compacts itself, the room: a prompt that reaches it would be refused by the provider.
        """
        if self.client_compacts or self.reservation_decides:
            return self.room
        return self.context_window * self.compact_at

    @cached_property
    def target_total(self) -> float:
        """What compaction aims the whole prompt at: `compact_to` of the window, scaled down with a lower trigger."""
        if self.reservation_decides:
            return self.room * self.compact_to / self.compact_at
        return self.context_window * self.compact_to

    def target_tokens(self, overhead_tokens: int) -> int:
        """The message budget compaction aims for: the target less the non-message overhead."""
        return max(int(self.target_total) - overhead_tokens, 0)


@dataclass(frozen=True)
class Anchor:
    """A provider-reported token count for the first `covered` messages of a conversation, overhead included."""

    tokens: int
    covered: int


@dataclass(frozen=True)
class Decision:
    """Whether to compact, and the numbers behind it, in the provider's tokens.

    :param estimated_tokens: The estimated size of the request (an upper bound when `bounded`).
    :param compact: Whether the estimate reached the trigger.
    :param target_tokens: The message budget for compaction in *local* tokens, the unit compactors measure in (0
        when not compacting).
    :param overhead_tokens: The estimated non-message part of the request.
    :param bounded: The estimate is a cheap upper bound that was already clearly under the trigger, so nothing was
        tokenized.
    :param scale: Provider tokens per local token, as calibrated; local counts were multiplied by it.
    """

    estimated_tokens: int
    compact: bool
    target_tokens: int = 0
    overhead_tokens: int = 0
    bounded: bool = False
    scale: float = 1.0


def estimate_tokens(
    transcript: Transcript, overhead_tokens: int, anchor: Anchor | None = None, scale: float = 1.0
) -> int:
    """The request's estimated size: the anchor plus the messages after it, or a full local count without one.

    Local counts are multiplied by `scale`, the calibrated provider tokens per local token.
    """
    if anchor is None or anchor.tokens <= 0:
        return round(scale * (transcript.total() + overhead_tokens))
    covered = min(anchor.covered, len(transcript))
    return anchor.tokens + round(scale * transcript.tokens_of(range(covered, len(transcript))))


def decide(
    thresholds: Thresholds,
    transcript: Transcript,
    overhead_tokens: int,
    anchor: Anchor | None = None,
    scale: float = 1.0,
) -> Decision:
    """Decide whether the conversation needs compacting, and to what message budget.

    Before any tokenizing, a cheap upper bound (UTF-8 bytes for BPE counters) is compared with the trigger: a request
    clearly under it is decided without counting.

    :param overhead_tokens: The local count of what is not messages (tool schemas, reply priming); unused with an
        anchor, which already includes it as the provider counts it.
    :param scale: Provider tokens per local token (see `Calibration`).
    """
    bound = _upper_bound(transcript, overhead_tokens, anchor, scale)
    if bound < thresholds.trigger_tokens:
        # An anchor covering every message is the estimate itself, not a bound.
        covered = anchor is not None and anchor.tokens > 0 and anchor.covered >= len(transcript)
        return Decision(estimated_tokens=bound, compact=False, bounded=not covered, scale=scale)
    estimated = estimate_tokens(transcript, overhead_tokens, anchor, scale)
    if estimated < thresholds.trigger_tokens:
        return Decision(estimated_tokens=estimated, compact=False, scale=scale)
    # With an anchor, whatever the provider counted beyond our message counts is overhead: tool schemas, template.
    if anchor is not None and anchor.tokens > 0:
        overhead = estimated - round(scale * transcript.total())
    else:
        overhead = round(scale * overhead_tokens)
    budget = thresholds.target_total - overhead
    return Decision(
        estimated_tokens=estimated,
        compact=True,
        target_tokens=max(int(budget / scale), 0),
        overhead_tokens=overhead,
        scale=scale,
    )


def _upper_bound(transcript: Transcript, overhead_tokens: int, anchor: Anchor | None, scale: float) -> int:
    start = 0
    base = 0
    local = overhead_tokens
    if anchor is not None and anchor.tokens > 0:
        start = min(anchor.covered, len(transcript))
        base = anchor.tokens
        local = 0
    local += sum(transcript.upper_bound(index) for index in range(start, len(transcript)))
    return base + math.ceil(scale * local)
