"""The trigger and the target, with and without a reply's reservation."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.engine import ApproximateCounter, Thresholds, Transcript
from proxy.engine.trigger import Anchor, decide


def test_without_a_reservation_the_fractions_decide() -> None:
    thresholds = Thresholds(10_000, 0.7, 0.4)
    assert (thresholds.trigger_tokens, thresholds.target_total, thresholds.reservation_decides) == (7000, 4000, False)


def test_a_large_reservation_lowers_the_trigger_to_the_room_left_and_the_target_in_proportion() -> None:
    thresholds = Thresholds(10_000, 0.7, 0.4, reserved_tokens=6000)
    assert thresholds.reservation_decides
    assert thresholds.trigger_tokens == 4000
    assert thresholds.target_total == 4000 * 0.4 / 0.7


def test_a_reservation_as_large_as_the_window_is_ignored() -> None:
    assert Thresholds(10_000, reserved_tokens=10_000).trigger_tokens == 7000


@given(
    window=st.integers(1, 2_000_000),
    reserved=st.integers(0, 3_000_000),
    at=st.floats(0.2, 1.0),
    ratio=st.floats(0.05, 0.95),
)
def test_what_passes_the_trigger_leaves_the_reply_its_room(window: int, reserved: int, at: float, ratio: float) -> None:
    thresholds = Thresholds(window, at, at * ratio, reserved_tokens=reserved)
    if reserved < window:
        assert thresholds.trigger_tokens + reserved <= window + 1e-6
    assert 0 <= thresholds.target_total < thresholds.trigger_tokens <= window * at + 1e-6


@given(
    window=st.integers(1, 2_000_000),
    reserved=st.integers(0, 3_000_000),
    at=st.floats(0.2, 1.0),
    ratio=st.floats(0.05, 0.95),
    fill=st.floats(0.0, 1.5),
)
def test_for_a_client_that_compacts_itself_only_a_prompt_that_would_not_fit_is_compacted(
    window: int, reserved: int, at: float, ratio: float, fill: float
) -> None:
    """A prompt that with the reply's reservation reaches the window would be refused; only that one is compacted."""
    deferring = Thresholds(window, at, at * ratio, reserved_tokens=reserved, client_compacts=True)
    own = Thresholds(window, at, at * ratio, reserved_tokens=reserved)
    estimate = max(round(fill * window), 1)
    kept_reservation = reserved if reserved < window else 0
    would_not_fit = estimate + kept_reservation >= window
    assert (estimate >= deferring.trigger_tokens) == would_not_fit
    assert deferring.trigger_tokens >= own.trigger_tokens
    assert deferring.target_total == own.target_total, "the safety net compacts to the same target"
    messages = [{"role": "user", "content": "x"}]
    decision = decide(deferring, Transcript(messages, ApproximateCounter()), 0, Anchor(estimate, covered=1))
    assert decision.compact == would_not_fit
