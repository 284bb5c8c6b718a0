"""The metric ring: bounded, and its minutes add up to its window's total, whatever was counted when."""

from __future__ import annotations

import itertools
import math

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from proxy.server.dashboard_figures import buckets, quantile
from proxy.server.metric_ring import MetricRing, snapshot

ROUTES = ("chat_completions", "responses", "other")

# Each minute: the increments counted in it, as (route, amount).
_MINUTES = st.lists(st.lists(st.tuples(st.sampled_from(ROUTES), st.integers(1, 50)), max_size=6), max_size=30)


@given(minutes=_MINUTES, points=st.integers(1, 8))
def test_minutes_add_up_to_the_windows_total_and_the_ring_stays_bounded(
    minutes: list[list[tuple[str, int]]], points: int
) -> None:
    registry = CollectorRegistry()
    requests = Counter("requests", "", ["route"], registry=registry)
    Counter("ignored", "", registry=registry).inc()
    now = [1_000.0]
    ring = MetricRing(registry, {"requests"}, points=points, clock=lambda: now[0])
    ring.sample()
    counted: list[dict[str, int]] = []
    for increments in minutes:
        this_minute: dict[str, int] = {}
        for route, amount in increments:
            requests.labels(route).inc(amount)
            this_minute[route] = this_minute.get(route, 0) + amount
        counted.append(this_minute)
        now[0] += 60
        ring.sample()
        assert len(ring) <= points

    window = ring.read()
    assert len(window.minutes) == len(window.ends) == min(len(minutes), points) + 1
    assert window.ends == sorted(window.ends)
    assert all(set(minute) <= {"requests_total"} for minute in [*window.minutes, window.total])
    kept = counted[len(counted) - len(window.minutes) + 1 :]
    for route in ROUTES:
        per_minute = [minute.get("requests_total", {}).get((("route", route),), 0.0) for minute in window.minutes]
        assert per_minute[-1] == 0  # nothing counted since the last sample
        assert per_minute[:-1] == [float(minute.get(route, 0)) for minute in kept]
        assert window.total.get("requests_total", {}).get((("route", route),), 0.0) == sum(per_minute)


def test_a_snapshot_keeps_totals_histograms_and_gauges_never_creation_times() -> None:
    registry = CollectorRegistry()
    Counter("things", "", registry=registry).inc(3)
    Histogram("sizes", "", buckets=(1, 10), registry=registry).observe(4)
    Gauge("held", "", registry=registry).set(7)
    assert snapshot(registry) == {
        "things_total": {(): 3.0},
        "sizes_bucket": {(("le", "1.0"),): 0.0, (("le", "10.0"),): 1.0, (("le", "+Inf"),): 1.0},
        "sizes_sum": {(): 4.0},
        "sizes_count": {(): 1.0},
        "held": {(): 7.0},
    }
    assert snapshot(registry, {"held"}) == {"held": {(): 7.0}}


_BOUNDS = (-0.5, -0.2, -0.1, -0.05, -0.02, 0.0, 0.02, 0.05, 0.1, 0.2, 0.5)


@given(
    observed=st.lists(st.floats(-0.9, 0.9, allow_nan=False), min_size=1, max_size=60),
    q=st.sampled_from((0.1, 0.5, 0.9)),
)
def test_a_quantile_from_buckets_lies_in_the_bucket_of_the_true_quantile(observed: list[float], q: float) -> None:
    registry = CollectorRegistry()
    errors = Histogram("error_ratio", "", buckets=_BOUNDS, registry=registry)
    for value in observed:
        errors.observe(value)
    found = quantile(q, buckets(snapshot(registry), "error_ratio"))
    assert found is not None
    ranked = sorted(observed)
    true = ranked[max(0, math.ceil(q * len(ranked)) - 1)]
    edges = [-math.inf, *_BOUNDS, math.inf]
    low, high = next((low, high) for low, high in itertools.pairwise(edges) if low < true <= high)
    assert max(low, _BOUNDS[0]) - 1e-9 <= found <= min(high, _BOUNDS[-1]) + 1e-9
