"""Calibration: local counts scaled to the provider's once the provider has reported once.

Calibrating on the whole anchored prefix every turn sums only what the previous turn had not summed (`Counts`).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.engine import (
    Anchor,
    Calibration,
    Thresholds,
    TiktokenCounter,
    Transcript,
    calibrated_decision,
    estimate_tokens,
)
from tests.engine.conversations import Conversation, conversations

RATIO = 1.4  # a provider whose tokenizer makes 40% more tokens of the same text than o200k_base


def conversation(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You answer questions about the deployment."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: why did the migration lock the table? " * 4})
        messages.append({"role": "assistant", "content": "Because the index was built without CONCURRENTLY. " * 6})
    return messages


def provider_count(transcript: Transcript, upto: int) -> int:
    return round(RATIO * (transcript.tokens_of(range(upto)) + 3))


def test_estimate_error_is_large_first_and_small_once_calibrated() -> None:
    counter = TiktokenCounter()
    thresholds = Thresholds(context_window=1_000_000)  # never triggers: this is about the estimate
    calibration = Calibration()
    messages = conversation(20)

    first = Transcript(messages[:3], counter)
    calibrated_decision(first, thresholds, 3, calibration=calibration)
    truth = provider_count(first, len(first))
    assert abs(estimate_tokens(first, 3, None, calibration.ratio) - truth) / truth > 0.25

    errors = []
    for end in range(5, len(messages), 2):
        transcript = Transcript(messages[:end], counter)
        anchor = Anchor(tokens=provider_count(transcript, end - 2), covered=end - 2)
        calibrated_decision(transcript, thresholds, 3, anchor, calibration=calibration)
        truth = provider_count(transcript, end)
        # Only the two newest messages are estimated locally: scaled by the calibrated ratio.
        estimate = estimate_tokens(Transcript(messages[:end], counter), 3, anchor, calibration.ratio)
        errors.append(abs(estimate - truth) / truth)
    assert max(errors) < 0.01
    assert calibration.ratio == pytest.approx(RATIO, rel=0.01)


def test_target_is_in_local_tokens_so_compaction_lands_at_the_providers_target() -> None:
    counter = TiktokenCounter()
    calibration = Calibration()
    messages = conversation(30)
    transcript = Transcript(messages, counter)
    local = transcript.total() + 3
    thresholds = Thresholds(context_window=int(RATIO * local / 0.8), compact_at=0.7, compact_to=0.4)
    anchor = Anchor(tokens=provider_count(transcript, len(messages)), covered=len(messages))
    decision = calibrated_decision(transcript, thresholds, 3, anchor, calibration=calibration)
    assert decision.compact
    # In the provider's tokens, the compacted messages plus overhead land at compact_to of the window.
    landed = RATIO * decision.target_tokens + decision.overhead_tokens
    assert landed == pytest.approx(thresholds.context_window * thresholds.compact_to, rel=0.01)


@pytest.mark.parametrize(("local", "provider"), [(10, 30), (1000, 10_000), (1000, 100), (1000, 0)])
def test_implausible_or_tiny_samples_are_ignored(local: int, provider: int) -> None:
    calibration = Calibration()
    calibration.observe(local, provider)
    assert calibration.ratio == 1.0 and calibration.samples == 0


def test_smoothing_moves_toward_new_observations() -> None:
    calibration = Calibration(smoothing=0.5)
    calibration.observe(1000, 1200)
    calibration.observe(1000, 1000)
    assert calibration.ratio == pytest.approx(1.1)
    with pytest.raises(ValueError, match="smoothing"):
        Calibration(smoothing=0)


@given(conversations(), st.lists(st.integers(min_value=0, max_value=60), min_size=1, max_size=6))
def test_a_transcript_carrying_its_predecessors_sum_measures_as_one_counting_afresh(
    drawn: Conversation, asked: list[int]
) -> None:
    """Every turn sums only past what the last one summed, and every prefix still sums to the fresh count."""
    counter = TiktokenCounter()
    messages = drawn.messages
    fresh = Transcript(messages, counter)
    counts = None
    for turn, length in enumerate(range(1, len(messages) + 1, 3)):
        tokens, summed = counts.extended(length) if counts is not None else (None, (0, 0))
        transcript = Transcript(messages[:length], counter, tokens=tokens, summed=summed)
        for wanted in asked:
            stop = min(wanted, length) if turn % 2 else length  # a prefix shorter than the sum, or the whole
            assert transcript.prefix_tokens(stop) == fresh.tokens_of(range(stop))
        assert transcript.total() == fresh.tokens_of(range(length))
        counts = transcript.counts()
        assert counts.summed[1] == fresh.tokens_of(range(counts.summed[0]))


def test_a_sum_over_more_messages_than_the_transcript_holds_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        Transcript(conversation(1), TiktokenCounter(), tokens=[1, 2, 3], summed=(4, 10))
