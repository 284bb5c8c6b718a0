"""Reused keys are exactly the keys hashing would give, whatever the client changes."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.chat.known_prefixes import KnownPrefixes
from proxy.engine.messages import chain_keys, message_key
from tests.engine.conversations import Conversation, conversations


def fresh(messages: list[dict[str, object]]) -> tuple[list[bytes], list[bytes]]:
    keys = [message_key(message) for message in messages]
    return keys, chain_keys(keys)


@settings(max_examples=60, deadline=None)
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
    assert prefixes._seen.keys() == {b"alice" + alice_keys[0], b"bob" + bob_keys[0]}
    assert alice_chain == fresh(messages)[1]
