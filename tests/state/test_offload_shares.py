"""The in-memory store's offloaded results: bounded in bytes and entries, and fair between tenants (properties)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.state.base import StoreEvents
from proxy.state.offload_memory import TenantOffloads, offload_cost
from tests.support.examples import examples

MAX_BYTES = 20_000
MAX_ENTRIES = 12
TENANTS = [b"alice", b"bob", b"carol"]


def offloads(events: StoreEvents | None = None) -> TenantOffloads:
    return TenantOffloads(MAX_ENTRIES, 60, lambda: 0.0, MAX_BYTES, events or StoreEvents())


writes = st.lists(st.tuples(st.sampled_from(TENANTS), st.integers(0, MAX_BYTES)), max_size=60)


@settings(max_examples=examples(200), deadline=None)
@given(writes)
def test_the_bounds_hold_and_the_charges_add_up(sequence: list[tuple[bytes, int]]) -> None:
    store = offloads()
    for number, (tenant, size) in enumerate(sequence):
        store.put(tenant, f"ref-{number}", "x" * size)
        assert store.cost <= MAX_BYTES and len(store) <= MAX_ENTRIES
        assert store.cost == sum(store.held_by(name) for name in TENANTS)
        if offload_cost("x" * size) <= MAX_BYTES:
            assert store.get(tenant, f"ref-{number}") == "x" * size  # the result just written is always kept


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(st.integers(0, 2_000), min_size=1, max_size=MAX_ENTRIES // 2),
    st.lists(st.integers(0, MAX_BYTES // 2 - 200), max_size=80),
)
def test_a_tenant_within_half_the_budget_keeps_its_results_whatever_another_writes(
    own: list[int], flood: list[int]
) -> None:
    events = StoreEvents()
    evicted: list[str] = []
    events.count_evicted = evicted.append
    store = offloads(events)
    for number, size in enumerate(own):
        store.put(b"alice", f"alice-{number}", "a" * size)
    if store.held_by(b"alice") * 2 > MAX_BYTES:
        return
    for number, size in enumerate(flood):
        store.put(b"mallory", f"mallory-{number}", "m" * size)
    assert [store.get(b"alice", f"alice-{number}") for number in range(len(own))] == ["a" * size for size in own]
    assert set(evicted) <= {"share"}


def test_a_single_tenant_has_the_whole_budget_least_recently_used_first() -> None:
    store = offloads()
    for number in range(MAX_ENTRIES + 3):
        store.put(b"alice", f"ref-{number}", "x")
    assert len(store) == MAX_ENTRIES
    assert store.get(b"alice", "ref-2") is None and store.get(b"alice", "ref-3") == "x"
