"""What a format kept of a conversation's latest forward is found by its next request, and by no other."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.pipeline.previous_forwards import ENTRY_BYTES, KEPT_AT, PreviousForwards

PROPERTIES = settings(max_examples=200, deadline=None)
KEYS = st.binary(min_size=4, max_size=4)


@PROPERTIES
@given(
    chains=st.lists(st.lists(KEYS, min_size=1, max_size=6, unique=True), min_size=1, max_size=8),
    added=st.lists(KEYS, max_size=5),
    marked=st.booleans(),
)
def test_each_conversations_next_request_finds_its_latest_state(
    chains: list[list[bytes]], added: list[bytes], marked: bool
) -> None:
    forwards = PreviousForwards(conversations=3)
    scope = b"tenant"
    # Chain keys hash everything before them: no key of one conversation is another's, nor a later message's.
    chains = [[bytes([turn]) + key for key in chain] for turn, chain in enumerate(chains)]
    added = [b"+" + key for key in added]
    for turn, chain in enumerate(chains):
        forwards.remember(scope, chain, turn)
    last = chains[-1]
    # The next request extends the last one, its newest message perhaps changed (a moved cache breakpoint).
    head = [*last[:-1], b"edited"] if marked and len(last) > 1 else last
    found = forwards.find(scope, head + added)
    assert found == len(chains) - 1
    assert forwards.find(b"another tenant", head + added) is None
    assert len(forwards._states) <= 3 * KEPT_AT


def test_nothing_is_kept_for_a_missing_state() -> None:
    forwards = PreviousForwards()
    forwards.remember(b"s", [b"a", b"b"], None)
    forwards.remember(b"s", [], "state")
    assert forwards.find(b"s", [b"a", b"b", b"c"]) is None


@PROPERTIES
@given(sizes=st.lists(st.integers(min_value=0, max_value=400), min_size=1, max_size=30))
def test_what_is_kept_stays_within_its_bytes_and_the_latest_state_that_fits_is_found(sizes: list[int]) -> None:
    budget = 4 * (400 + ENTRY_BYTES)
    forwards = PreviousForwards(memory_bytes=budget)
    for number, size in enumerate(sizes):
        chain = [f"{number}-{turn}".encode() for turn in range(3)]
        forwards.remember(b"s", chain, number, size)
        charged = sum(cost for _, cost in forwards._states.values())
        assert forwards._bytes == charged <= budget
        assert forwards.find(b"s", chain) == number
