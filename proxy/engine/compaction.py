"""The whole decision in one call: calibrate, estimate, trigger, compact.

`calibrated_decision` is the proxy's decision and `compact_if_needed` the CLI's. The Haystack hook makes the same
calibration observation (the provider's count of the anchored prefix against the local count of the same messages)
incrementally and calls `decide` with the resulting ratio, so all three decide identically on the same conversation.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.engine.calibration import Calibration
from proxy.engine.strategies.chain import CompactionChain, CompactionResult
from proxy.engine.transcript import Transcript
from proxy.engine.trigger import Anchor, Decision, Thresholds, decide


@dataclass(frozen=True)
class Outcome:
    """The decision, and the compaction it led to (None when not triggered or when nothing could be removed)."""

    decision: Decision
    result: CompactionResult | None = None

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
    """Decide, and compact when the estimate reaches the trigger."""
    decision = calibrated_decision(transcript, thresholds, overhead_tokens, anchor, calibration=calibration)
    if not decision.compact:
        return Outcome(decision)
    return Outcome(decision, chain.compact(transcript, decision.target_tokens))
