"""The counters' caches: bounded, least recently used forgotten first, against a plain reference model."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.engine import ApproximateCounter
from proxy.engine.bounded import BoundedCache
from tests.support.examples import examples

Operation = tuple[str, int]
OPERATIONS = st.lists(st.tuples(st.sampled_from(["get", "put"]), st.integers(0, 12)), max_size=200)


class _MeasuringCounter(ApproximateCounter):
    """An approximate counter that records every text it measures, so a test sees which counts were cached."""

    def __init__(self, cache_size: int) -> None:
        super().__init__(cache_size=cache_size)
        self.measured: list[str] = []

    def text_tokens(self, text: str) -> int:
        self.measured.append(text)
        return super().text_tokens(text)


@settings(max_examples=examples(300), deadline=None)
@given(max_entries=st.integers(0, 6), operations=OPERATIONS)
def test_the_cache_keeps_the_most_recently_used_entries_up_to_its_bound(
    max_entries: int, operations: list[Operation]
) -> None:
    """After any sequence of lookups and stores, the cache holds exactly the `max_entries` most recently used keys."""
    cache: BoundedCache[int, int] = BoundedCache(max_entries)
    recency: list[int] = []  # the reference: keys least recently used first, unbounded
    for operation, key in operations:
        if operation == "put":
            cache.put(key, key * 10)
            recency = [*(other for other in recency if other != key), key]
        else:
            expected = key * 10 if key in recency[max(len(recency) - max_entries, 0) :] else None
            assert cache.get(key) == expected
            if expected is not None:
                recency = [*(other for other in recency if other != key), key]
        assert len(cache) <= max_entries
        assert cache.keys() == recency[max(len(recency) - max_entries, 0) :]


def test_a_counter_forgets_the_least_recently_counted_message_first() -> None:
    """A message counted again stays cached; the one untouched longest is the one measured again."""
    counter = _MeasuringCounter(cache_size=3)
    first, second, third, fourth = ({"role": "user", "content": f"message {n}"} for n in range(4))
    for message in (first, second, third, first, fourth):
        counter.message_tokens(message)
    counter.measured.clear()

    counter.message_tokens(first)
    assert counter.measured == [], "the message counted most recently but one was forgotten"
    counter.message_tokens(second)
    assert counter.measured == ["user", "message 1"], "the least recently used message was kept"


def test_a_counter_forgets_the_least_recently_used_tool_set_first() -> None:
    """A client's tool set, sent with every request, stays cached however many other tool sets come and go."""
    counter = _MeasuringCounter(cache_size=3)
    own = {"tools": [{"type": "function", "function": {"name": "read_file"}}]}
    for n in range(1000):
        counter.overhead_tokens(own)
        counter.overhead_tokens({"tools": [{"type": "function", "function": {"name": f"tool_{n}"}}]})
    assert sum("read_file" in text for text in counter.measured) == 1


def test_long_tool_call_arguments_are_not_kept_after_hashing() -> None:
    """Hashing keeps canonical forms of short arguments only: long ones, which clients choose, would pile up."""
    from proxy.engine.messages import _cached_canonical_json_text, message_key

    before = _cached_canonical_json_text.cache_info().currsize
    for n in range(20):
        arguments = '{"text": "' + "x" * 100_000 + f'{n}"}}'
        call = {"id": f"c{n}", "type": "function", "function": {"name": "write", "arguments": arguments}}
        message_key({"role": "assistant", "content": None, "tool_calls": [call]})
    assert _cached_canonical_json_text.cache_info().currsize == before
