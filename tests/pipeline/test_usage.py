"""Usage reports anchor only when plausible against the proxy's own estimate of the same request."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.engine.calibration import RATIO_BOUNDS
from proxy.pipeline.usage import PLAUSIBILITY_SLACK, Estimate


@given(st.integers(min_value=1, max_value=10**7), st.floats(min_value=RATIO_BOUNDS[0], max_value=RATIO_BOUNDS[1]))
def test_any_tokenizer_gap_within_the_calibration_bounds_is_plausible(estimate: int, ratio: float) -> None:
    assert Estimate(estimate).admits(int(estimate * ratio))


def test_wild_reports_are_not_plausible() -> None:
    assert not Estimate(5_000).admits(10**15)
    assert not Estimate(5_000).admits(4 * 5_000 + PLAUSIBILITY_SLACK + 1)
    assert not Estimate(50_000).admits(1)


def test_an_upper_bound_only_caps_the_report_from_above() -> None:
    assert Estimate(40_000, bound=True).admits(1)
    assert not Estimate(40_000, bound=True).admits(10**15)
