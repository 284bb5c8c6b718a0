"""The ledger's shortcuts give what the general computation gives: the same opening digest, the same misses."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.engine.messages import Message, _general_key, message_key
from proxy.pipeline.cache_misses import CAUSES, Misses
from proxy.pipeline.ledger_entries import opening_digest
from tests.support.examples import examples

texts = st.text(max_size=12)
blocks = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.one_of(texts, st.integers())}),
    st.fixed_dictionaries(
        {"type": st.just("text"), "text": texts},
        optional={"cache_control": st.fixed_dictionaries({"type": st.just("ephemeral")})},
    ),
    st.fixed_dictionaries({"type": st.just("image"), "source": texts}),
    texts,
)
contents = st.one_of(st.none(), texts, st.lists(blocks, max_size=3))
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"])},
        optional={"content": contents, "name": texts},
    ),
    max_size=4,
)
bodies = st.fixed_dictionaries({}, optional={"system": contents, "instructions": contents})


@settings(max_examples=examples(300))
@given(messages, bodies)
def test_the_opening_digest_from_known_keys_is_the_one_hashed_again(sent: list[Message], body: dict[str, Any]) -> None:
    """The keys `open_entry` already made of the client's messages stand for the opening's own where no mark is
    taken off: the digest is the same as hashing the opening again."""
    known = [message_key(message) for message in sent]
    assert opening_digest(sent, body, known) == opening_digest(sent, body)


@given(st.builds(Misses, *(st.integers(min_value=0, max_value=10**9) for _ in CAUSES)))
def test_misses_spelled_out_are_every_field_in_the_order_of_the_causes(misses: Misses) -> None:
    by_field = {field.name: getattr(misses, field.name) for field in fields(misses)}
    assert misses.as_dict() == by_field
    assert tuple(misses.as_dict()) == CAUSES
    assert misses.total == sum(by_field.values())


any_text = st.text(st.characters(exclude_categories=()), max_size=8)
"""Any text, lone surrogates included (some clients send them; both paths encode them alike)."""
arguments = st.one_of(any_text, st.just('{"b": 1, "a": [2]}'), st.dictionaries(texts, st.integers(), max_size=2))
calls = st.fixed_dictionaries(
    {"id": st.one_of(st.none(), any_text), "type": st.just("function")},
    optional={
        "function": st.fixed_dictionaries({"name": st.one_of(any_text, st.none())}, optional={"arguments": arguments})
    },
)
identifiers = st.integers(min_value=1)
"""A name or call id that is not text: a true one (the shortcut has always keyed a false one, `0`, as empty)."""
wire_messages = st.fixed_dictionaries(
    {},
    optional={
        "role": st.one_of(st.sampled_from(["user", "assistant", "tool"]), any_text, st.integers()),
        "content": st.one_of(contents, any_text, st.integers()),
        "name": st.one_of(any_text, st.none(), identifiers),
        "tool_call_id": st.one_of(any_text, st.none(), identifiers),
        "tool_calls": st.one_of(st.lists(st.one_of(calls, any_text), max_size=3), st.none(), st.just({"x": 1})),
        "function_call": st.one_of(st.none(), st.fixed_dictionaries({"name": any_text, "arguments": arguments})),
    },
)


@settings(max_examples=examples(500))
@given(wire_messages)
def test_a_message_keys_the_same_by_its_shortcut_as_by_the_general_path(message: dict[str, Any]) -> None:
    """Text and tool-call messages are hashed with fewer steps; the bytes hashed are the general path's."""
    assert message_key(message) == _general_key(message)
