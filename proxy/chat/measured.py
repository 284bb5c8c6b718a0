"""A request as the engine measured it: its transcript counted, the decision made, and what that rests on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.chat.rewrites import View
from proxy.engine import Anchor, Calibration, Decision, Thresholds, TokenCounter, Transcript, calibrated_decision


@dataclass(frozen=True)
class Measured:
    """The transcript, its thresholds, the decision and what it rests on (the overhead and the anchor)."""

    transcript: Transcript
    thresholds: Thresholds
    decision: Decision
    overhead: int
    anchor: Anchor | None


def measure(  # noqa: PLR0917 - the decision's inputs, gathered on the loop and handed to a worker thread
    view: View,
    overhead_fields: Mapping[str, Any],
    counter: TokenCounter,
    thresholds: Thresholds,
    anchor: Anchor | None,
    calibration: Calibration,
    counted: list[int | None] | None,
) -> Measured:
    """Count what the decision needs and decide (CPU work, run off the event loop for large requests).

    :param overhead_fields: The request's fields the engine counts besides the messages (the tools).
    :param counted: The view's counts already made (for a known request extended), by position.
    """
    transcript = Transcript(view.messages, counter, view.meta, tokens=counted, keys=view.keys)
    overhead = counter.overhead_tokens(overhead_fields)
    decision = calibrated_decision(transcript, thresholds, overhead, anchor, calibration=calibration)
    return Measured(transcript, thresholds, decision, overhead, anchor)
