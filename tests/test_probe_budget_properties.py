"""The probe budget and the per-tenant back-offs of exact-count methods (properties).

Whatever the order of tenants asking and of time passing: no tenant starts more than its runs in a minute, all
tenants together no more than the overall runs, a run is refused only when one of the bounds is reached, each refusal
is counted once; and one tenant's failed tries never change which methods another tenant tries.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.discovery.budget import INTERVAL_SECONDS, Bound, ProbeBudget, ProbeKind
from proxy.discovery.trials import Trials
from tests.support.examples import examples

TENANTS = [b"alice", b"bob", b"carol", b"dave"]
METHODS = ["llama_cpp_template", "vllm_tokenize"]

asks = st.lists(st.tuples(st.sampled_from(TENANTS), st.floats(0, INTERVAL_SECONDS / 3)), max_size=80)
"""Each ask: the tenant asking, and how many seconds pass before it."""


@settings(max_examples=examples(300), deadline=None)
@given(asks, st.integers(0, 5), st.integers(0, 12))
def test_runs_stay_within_both_bounds_and_only_a_bound_refuses(
    sequence: list[tuple[bytes, float]], per_tenant: int, overall: int
) -> None:
    now = [0.0]
    refusals: list[Bound] = []
    budget = ProbeBudget(per_tenant, overall, lambda _kind, bound: refusals.append(bound), clock=lambda: now[0])
    ends, started, total = float("-inf"), Counter[bytes](), 0
    for tenant, elapsed in sequence:
        now[0] += elapsed
        if now[0] >= ends:  # a minute starts with the first ask past the last one's end
            ends, started, total = now[0] + INTERVAL_SECONDS, Counter(), 0
        room = started[tenant] < per_tenant and total < overall
        refused = len(refusals)
        assert budget.admit(tenant, ProbeKind.WINDOW) == room
        if room:
            started[tenant] += 1
            total += 1
        else:
            assert refusals[refused:] == [Bound.OVERALL if total >= overall else Bound.TENANT]
        assert started[tenant] <= per_tenant and total <= overall


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.sampled_from(TENANTS[1:]), st.sampled_from(METHODS)), max_size=30))
def test_other_tenants_failures_leave_a_tenants_methods_alone(failures: list[tuple[bytes, str]]) -> None:
    trials = Trials(METHODS, ProbeBudget(10, 60), ProbeKind.COUNT)
    for tenant, method in failures:
        trials.failed(method, tenant)
        assert trials.usable(b"alice") == METHODS
        assert method not in trials.usable(tenant)  # the failing tenant waits its back-off
    trials.succeeded(METHODS[1])
    assert all(trials.usable(tenant) == [METHODS[1]] for tenant in TENANTS)  # one answer serves everyone
