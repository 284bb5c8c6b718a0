"""A request as the engine measured it: its transcript counted, the decision made, and what that rests on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.engine import Anchor, Calibration, Decision, Thresholds, TokenCounter, Transcript, calibrated_decision
from proxy.engine.provider_edits import ProviderView
from proxy.engine.transcript import Counts
from proxy.engine.trigger import estimate_tokens
from proxy.pipeline.rewrites import View
from proxy.pipeline.usage import Estimate


@dataclass(frozen=True)
class Measured:
    """The transcript, its thresholds, the decision and what it rests on (the overhead and the anchor).

    :param exact: The upstream's exact count the decision rests on, or None (none, beaten by the usage anchor, or
        implausible).
    :param local_tokens: The calibrated local estimate of what the upstream counted exactly, when it did.
    :param provider: The transcript as the provider processes it after its own edits, when the request asks for any
        (`proxy.pipeline.provider_edits`); the decision rests on it.
    """

    transcript: Transcript
    thresholds: Thresholds
    decision: Decision
    overhead: int
    anchor: Anchor | None
    exact: Anchor | None = None
    local_tokens: int | None = None
    provider: ProviderView | None = None

    @property
    def compaction_transcript(self) -> Transcript:
        """What compaction works on: what the provider clears counted as what it leaves (the transcript without)."""
        return self.provider.transcript if self.provider is not None else self.transcript


def measure(  # noqa: PLR0917 - the decision's inputs, gathered on the loop and handed to a worker thread
    view: View,
    overhead_fields: Mapping[str, Any],
    counter: TokenCounter,
    thresholds: Thresholds,
    anchor: Anchor | None,
    calibration: Calibration,
    counted: Counts | None,
    exact: Anchor | None = None,
    added_tokens: int = 0,
) -> Measured:
    """Count what the decision needs and decide (CPU work, run off the event loop for large requests).

    :param overhead_fields: The request's fields the engine counts besides the messages (the tools).
    :param anchor: The provider's usage report for the longest known prefix, if any.
    :param counted: The view's counts already made (for a known request extended), by position.
    :param exact: The upstream's exact count of a prefix of the view (see `proxy.pipeline.exact_counts`). The decision
        rests on whichever of it and `anchor` covers more; it is first compared with the calibrated local count of
        the same prefix, and ignored when the two are further apart than any tokenizer difference explains.
    :param added_tokens: What the provider adds to the prompt that no field shows (`WireRequest.added_prompt_tokens`).
    """
    tokens, summed = counted if counted is not None else (None, (0, 0))
    transcript = Transcript(
        view.messages, counter, view.meta, tokens, keys=view.keys, summed=summed, counted_bounds=False
    )
    overhead = counter.overhead_tokens(overhead_fields) + added_tokens
    local = None
    if exact is not None and (anchor is None or exact.covered > anchor.covered):
        covered = exact.covered
        whole = covered >= len(transcript)
        prefix = transcript if whole else Transcript(view.messages[:covered], counter, keys=view.keys[:covered])
        local = estimate_tokens(prefix, overhead, anchor, calibration.ratio)
        if Estimate(local).admits(exact.tokens):
            anchor = exact
        else:
            exact = None
    else:
        exact = None
    decision = calibrated_decision(transcript, thresholds, overhead, anchor, calibration=calibration)
    return Measured(transcript, thresholds, decision, overhead, anchor, exact, local)
