"""Reused keys are exactly the keys hashing would give, whatever the client changes."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.engine.messages import chain_keys, message_key
from proxy.pipeline.known_prefixes import KnownPrefixes
from tests.engine.conversations import Conversation, conversations
from tests.support.examples import examples


def fresh(messages: list[dict[str, object]]) -> tuple[list[bytes], list[bytes]]:
    keys = [message_key(message) for message in messages]
    return keys, chain_keys(keys)


@settings(max_examples=examples(60), deadline=None)
@given(conversation=conversations(), cut=st.integers(min_value=0, max_value=40), edit=st.booleans())
def test_keys_match_fresh_hashing_after_growth_and_edits(conversation: Conversation, cut: int, edit: bool) -> None:
    prefixes = KnownPrefixes()
    messages = conversation.messages
    first = copy.deepcopy(messages[: max(cut, 1)])
    assert prefixes.keys(b"t", first) == fresh(first)
    # The client sends the history again (new objects, as a fresh parse gives), possibly with an earlier message edited.
    again = copy.deepcopy(messages)
    if edit and again:
        again[0] = {**again[0], "content": "edited"}
    assert prefixes.keys(b"t", again) == fresh(again)


def test_tenants_never_reuse_each_others_prefixes() -> None:
    prefixes = KnownPrefixes()
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    alice_keys, alice_chain = prefixes.keys(b"alice", messages)
    bob_keys, bob_chain = prefixes.keys(b"bob", [*copy.deepcopy(messages), {"role": "user", "content": "more"}])
    assert (bob_keys, bob_chain) == fresh([*messages, {"role": "user", "content": "more"}])
    assert prefixes._seen.openings() == {b"alice" + alice_keys[0], b"bob" + bob_keys[0]}
    assert alice_chain == fresh(messages)[1]


def conversation(name: str, length: int = 3, text: str = "") -> list[dict[str, object]]:
    return [{"role": "user", "content": f"{name} {index} {text}"} for index in range(length)]


def reused_prefix(
    prefixes: KnownPrefixes, tenant: bytes, messages: list[dict[str, object]], earlier: list[bytes]
) -> bool:
    """Whether `keys` reused the remembered keys (the very same objects) instead of hashing the messages again."""
    keys, _chain = prefixes.keys(tenant, [*copy.deepcopy(messages), {"role": "user", "content": "next"}])
    return all(key is known for key, known in zip(keys, earlier, strict=False))


@settings(max_examples=examples(100), deadline=None)
@given(sizes=st.lists(st.integers(min_value=0, max_value=5_000), min_size=1, max_size=40))
def test_remembered_requests_never_cost_more_than_the_budget(sizes: list[int]) -> None:
    prefixes = KnownPrefixes(max_bytes=20_000)
    for number, size in enumerate(sizes):
        prefixes.keys(b"t", conversation(f"c{number}"), body_bytes=size)
        assert prefixes.cost <= 20_000


def test_the_least_recently_seen_conversation_is_forgotten_first() -> None:
    prefixes = KnownPrefixes(max_bytes=4 * (1_000 + 3 * 400))
    first, second = conversation("first"), conversation("second")
    first_keys, _ = prefixes.keys(b"t", first, body_bytes=1_000)
    second_keys, _ = prefixes.keys(b"t", second, body_bytes=1_000)
    prefixes.keys(b"t", conversation("third"), body_bytes=1_000)
    first_keys, _ = prefixes.keys(b"t", copy.deepcopy(first), body_bytes=1_000)  # seen again: now the most recent
    prefixes.keys(b"t", conversation("fourth"), body_bytes=1_000)
    prefixes.keys(b"t", conversation("fifth"), body_bytes=1_000)  # over budget: the least recently seen goes

    assert reused_prefix(prefixes, b"t", first, first_keys)
    assert not reused_prefix(prefixes, b"t", second, second_keys)


def test_a_request_over_a_quarter_of_the_budget_is_not_remembered() -> None:
    prefixes = KnownPrefixes(max_bytes=40_000)
    kept, large = conversation("kept"), conversation("large")
    kept_keys, _ = prefixes.keys(b"t", kept, body_bytes=1_000)
    large_keys, _ = prefixes.keys(b"t", large, body_bytes=10_000)

    assert not reused_prefix(prefixes, b"t", large, large_keys)
    assert reused_prefix(prefixes, b"t", kept, kept_keys), "a request too large to keep evicted another"
    assert prefixes.cost <= 40_000


def test_without_a_body_size_the_messages_are_measured() -> None:
    """Many large distinct requests (issue 14: 50 of 8.4 MB took 420 MiB) stay within the budget unmeasured too."""
    prefixes = KnownPrefixes(max_bytes=2 * 2**20)
    large_keys = []
    for number in range(20):
        messages = conversation(f"c{number}", length=2, text="x" * 200_000)
        large_keys.append((messages, prefixes.keys(b"t", messages)[0]))
        assert prefixes.cost <= 2 * 2**20
    messages, keys = large_keys[-1]
    assert reused_prefix(prefixes, b"t", messages, keys)
    too_large = conversation("huge", length=2, text="x" * 300_000)
    assert not reused_prefix(prefixes, b"t", too_large, prefixes.keys(b"t", too_large)[0])
