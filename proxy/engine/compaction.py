"""The whole decision in one call: calibrate, estimate, trigger, compact.

`calibrated_decision` is the proxy's decision and `compact_if_needed` the CLI's. The Haystack hook makes the same
calibration observation (the provider's count of the anchored prefix against the local count of the same messages)
incrementally and calls `decide` with the resulting ratio, so all three decide identically on the same conversation.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from proxy.engine.calibration import Calibration
from proxy.engine.grouping import leading_instructions_end
from proxy.engine.strategies.chain import CompactionChain, CompactionResult
from proxy.engine.transcript import Transcript
from proxy.engine.trigger import Anchor, Decision, Thresholds, decide


class Room(StrEnum):
    """What the leading block (instructions and the context a client states up front) and the tools leave.

    Both are never compacted, so when they alone reach the target there is nothing compaction may do about them.
    """

    OVER_TARGET = "over-target"
    """They alone leave no room under the target: everything else is compacted as far as the rules allow."""
    OVER_WINDOW = "over-window"
    """They alone exceed the window: no compaction can make the request fit, so it goes as it came."""


def leading_room(
    transcript: Transcript, *, target_tokens: int, overhead_tokens: int, scale: float, window: int
) -> Room | None:
    """Whether the leading block and the tools leave no room under the target (or in the window); None if they do.

    :param target_tokens: The message budget in local tokens (what the chain aims at).
    :param overhead_tokens: What is not messages (the tools), in the provider's tokens.
    :param scale: Provider tokens per local token.
    :param window: The context window, in the provider's tokens.
    """
    lead = transcript.tokens_of(range(leading_instructions_end(transcript)))
    if round(scale * lead) + overhead_tokens > window:
        return Room.OVER_WINDOW
    return Room.OVER_TARGET if lead >= target_tokens else None


def decision_room(transcript: Transcript, decision: Decision, thresholds: Thresholds) -> Room | None:
    """`leading_room` for a decision to compact (None for a decision not to)."""
    if not decision.compact:
        return None
    return leading_room(
        transcript,
        target_tokens=decision.target_tokens,
        overhead_tokens=decision.overhead_tokens,
        scale=decision.scale,
        window=thresholds.context_window,
    )


@dataclass(frozen=True)
class Outcome:
    """The decision, and the compaction it led to (None when not triggered or when nothing could be removed).

    :param room: Set when the leading block and the tools alone reach the target (see `Room`); over the window,
        nothing is compacted.
    """

    decision: Decision
    result: CompactionResult | None = None
    room: Room | None = None

    @property
    def tokens_after(self) -> int:
        """The estimated request size after compaction, in the provider's tokens (the estimate before, if unchanged)."""
        if self.result is None:
            return self.decision.estimated_tokens
        return round(self.decision.scale * self.result.tokens_after) + self.decision.overhead_tokens


def calibrated_decision(
    transcript: Transcript,
    thresholds: Thresholds,
    overhead_tokens: int,
    anchor: Anchor | None = None,
    *,
    calibration: Calibration | None = None,
) -> Decision:
    """Decide, first learning from the anchor how the provider's counts compare with ours.

    The anchored prefix was counted by the provider and, message by message, by us: their ratio calibrates how the
    messages after it are estimated.
    """
    if calibration is None:
        return decide(thresholds, transcript, overhead_tokens, anchor)
    if anchor is not None and anchor.tokens > 0 and anchor.covered > 0:
        covered = min(anchor.covered, len(transcript))
        calibration.observe(transcript.prefix_tokens(covered) + overhead_tokens, anchor.tokens)
    return decide(thresholds, transcript, overhead_tokens, anchor, calibration.ratio)


def compact_if_needed(
    transcript: Transcript,
    thresholds: Thresholds,
    chain: CompactionChain,
    overhead_tokens: int,
    anchor: Anchor | None = None,
    *,
    calibration: Calibration | None = None,
) -> Outcome:
    """Decide, and compact when the estimate reaches the trigger (not when the leading block exceeds the window)."""
    decision = calibrated_decision(transcript, thresholds, overhead_tokens, anchor, calibration=calibration)
    if not decision.compact:
        return Outcome(decision)
    room = decision_room(transcript, decision, thresholds)
    if room is Room.OVER_WINDOW:
        return Outcome(decision, room=room)
    return Outcome(decision, chain.compact(transcript, decision.target_tokens), room)
