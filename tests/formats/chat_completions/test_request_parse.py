"""A request body parses to the same thing whatever its size, and what one parser refuses the other refuses too.

Bodies from `LEAN_PARSE_FROM_BYTES` are parsed with the standard library's parser (less working memory), smaller
ones with orjson: the two must agree on every body the proxy accepts, and refuse the same malformed ones. (One
difference is left: the standard library takes a lone surrogate escape such as `"\\ud800"`, which orjson refuses;
such a body is then counted and forwarded as it came, as orjson's refusal would have it forwarded.)
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.formats.chat_completions.request import ChatRequest
from proxy.pipeline.requests import LEAN_PARSE_FROM_BYTES, InvalidRequest
from tests.support.examples import examples

PAD = "x" * LEAN_PARSE_FROM_BYTES

integers = st.integers(-(2**63), 2**63 - 1)
scalars = st.none() | st.booleans() | integers | st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    scalars | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "tool"]), "content": st.text()}).flatmap(
        lambda message: st.dictionaries(st.text(max_size=8), json_values, max_size=3).map(
            lambda extra: {**extra, **message}
        )
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=examples(60), deadline=None)
@given(messages=messages, extra=json_values)
def test_a_large_body_parses_as_orjson_parses_it(messages: list[dict[str, Any]], extra: Any) -> None:
    raw = orjson.dumps({"model": "gpt-4o", "messages": messages, "metadata": extra, "pad": PAD})
    assert len(raw) >= LEAN_PARSE_FROM_BYTES
    request = ChatRequest.parse(raw)
    assert request.body == orjson.loads(raw)
    assert request.messages == messages


@pytest.mark.parametrize(
    "malformed",
    [
        b'{"model": "gpt-4o", "messages": [], "temperature": NaN, "pad": "%s"}',
        b'{"model": "gpt-4o", "messages": [], "temperature": -Infinity, "pad": "%s"}',
        b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "\xff\xfe"}], "pad": "%s"}',
        b'{"model": "gpt-4o", "messages": [], "pad": "%s"} trailing',
        b'{"model": "gpt-4o", "messages": [], "pad": "%s", "deep": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    ],
    ids=["nan", "infinity", "not-utf-8", "trailing-bytes", "nested-too-deep"],
)
@pytest.mark.parametrize("size", ["small", "large"])
def test_what_orjson_refuses_is_refused_at_any_size(malformed: bytes, size: str) -> None:
    raw = malformed.replace(b"%s", PAD.encode() if size == "large" else b"")
    assert (len(raw) >= LEAN_PARSE_FROM_BYTES) == (size == "large")
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(raw)
    with pytest.raises(InvalidRequest):
        ChatRequest.parse(raw)
