"""The checks every format's parse makes decide as their definitions do, whatever shortcut they take.

`json_object` refuses a body nesting deeper than `MAX_JSON_DEPTH` (what `nests_too_deep` says), testing first
whether it could (orjson writing it back, or counting `{` and `[` in a body the standard library parsed);
`checked_objects` checks the proxy's limits and that every entry is an object in one walk. Here both are compared
with their definitions over random bodies, nested around the limit, small and past `LEAN_PARSE_FROM_BYTES`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.pipeline.requests import (
    LEAN_PARSE_FROM_BYTES,
    MAX_JSON_DEPTH,
    InvalidRequest,
    NestedTooDeep,
    RequestLimits,
    RequestOverLimit,
    checked_objects,
    json_object,
    nests_too_deep,
)
from tests.support.examples import examples

numbers = st.integers() | st.floats(allow_nan=False, allow_infinity=False)
leaves = st.none() | st.booleans() | numbers | st.text(max_size=8)
values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=12,
)


@st.composite
def nested(draw: st.DrawFn) -> Any:
    """A value nesting about `MAX_JSON_DEPTH` levels, each a list or an object, with random values beside the path."""
    value = draw(values)
    for _ in range(draw(st.integers(MAX_JSON_DEPTH - 6, MAX_JSON_DEPTH + 3))):
        beside = draw(st.lists(values, max_size=1))
        value = [value, *beside] if draw(st.booleans()) else {"k": value, **{str(i): v for i, v in enumerate(beside)}}
    return value


def verdict(raw: bytes | str) -> str:
    """What `json_object` makes of `raw`: `deep`, `ok`, or `invalid`."""
    try:
        json_object(raw)
    except NestedTooDeep:
        return "deep"
    except InvalidRequest:
        return "invalid"
    return "ok"


@settings(max_examples=examples(200))
@given(nested(), values, st.sampled_from(["body", "tools"]))
def test_a_body_is_refused_as_too_deep_exactly_when_it_nests_deeper_than_the_limit(
    deep: Any, other: Any, where: str
) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "extra": other, where: deep}
    raw = json.dumps(body).encode()
    assert verdict(raw) == ("deep" if nests_too_deep([body]) else "ok")


@settings(max_examples=examples(20))
@given(nested())
def test_a_large_body_read_by_the_standard_library_is_judged_the_same(deep: Any) -> None:
    """Past `LEAN_PARSE_FROM_BYTES` (parsed by `json`), with an integer orjson could not write, which is no nesting."""
    body = {"padding": "x" * LEAN_PARSE_FROM_BYTES, "big": 2**80, "tools": deep}
    raw = json.dumps(body).encode()
    assert verdict(raw) == ("deep" if nests_too_deep([body]) else "ok")
    assert verdict(raw.decode()) == verdict(raw)


def test_a_large_body_with_only_an_integer_past_64_bits_is_not_too_deep() -> None:
    raw = json.dumps({"padding": "x" * LEAN_PARSE_FROM_BYTES, "big": 2**80}).encode()
    assert verdict(raw) == "ok"


def reference(entries: list[Any], limits: RequestLimits | None) -> str:
    """`checked_objects` as defined: the limits first, then every entry an object, in order."""
    try:
        if limits is not None:
            limits.check(entries)
    except RequestOverLimit as over:
        return over.code
    for position, entry in enumerate(entries):
        if not isinstance(entry, dict):
            return f"invalid {position}"
    return "ok"


def checked(entries: list[Any], limits: RequestLimits | None) -> str:
    try:
        checked_objects(entries, "messages", limits)
    except RequestOverLimit as over:
        return over.code
    except InvalidRequest as invalid:
        return f"invalid {str(invalid).split('[')[1].split(']')[0]}"
    return "ok"


entries = st.lists(
    st.one_of(
        st.fixed_dictionaries({"role": st.just("user"), "content": st.text(max_size=3) | st.lists(leaves, max_size=4)}),
        st.fixed_dictionaries({"role": st.just("tool")}),
        leaves,
    ),
    max_size=8,
)


@settings(max_examples=examples(300))
@given(entries, st.none() | st.builds(RequestLimits, st.integers(0, 8), st.integers(0, 12)))
def test_the_checks_of_the_entries_decide_as_their_definition(
    messages: list[Any], limits: RequestLimits | None
) -> None:
    assert checked(messages, limits) == reference(messages, limits)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1])
def test_the_limit_itself(depth: int) -> None:
    """The body's own object is level 1: `depth - 1` lists inside it nest `depth` levels."""
    raw = b'{"a":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"
    assert verdict(raw) == ("deep" if depth > MAX_JSON_DEPTH else "ok")
