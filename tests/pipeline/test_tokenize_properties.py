"""Property: llama.cpp's count, made of remembered prefixes and only the new text tokenized, equals the whole count.

A conversation grows in random steps (any roles, texts with newlines, punctuation and digits); after each step the
prompt count `LlamaCppTemplate` makes, remembering what it rendered before, must equal what the server reports for
the whole prompt, and a step after a changed earlier message must not reuse what no longer matches. The server is
the loopback fake's own answers (`tests.support.counting_upstream.counting_answer`), called without a socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.discovery.tokenize import Conversation, LlamaCppTemplate
from proxy.engine.messages import chain_keys, message_key
from tests.support.counting_upstream import ROUTES, counting_answer, fake_tokens, render
from tests.support.examples import examples

ROLES = st.sampled_from(["system", "user", "assistant", "tool"])
TEXTS = st.text(alphabet=st.sampled_from(list("ab1 ,.\n<|>_xyz")), max_size=40)
MESSAGES = st.lists(st.fixed_dictionaries({"role": ROLES, "content": TEXTS}), min_size=1, max_size=12)


async def fetch(method: str, path: str, body: Mapping[str, Any] | None) -> Any:
    assert body is not None and ("llama.cpp", path) in ROUTES
    return counting_answer("llama.cpp", path, body)


def count(method: LlamaCppTemplate, messages: list[dict[str, Any]]) -> int | None:
    keys = chain_keys([message_key(message) for message in messages])
    return asyncio.run(method(fetch, Conversation("m", messages, {}, keys, b"scope")))


@settings(max_examples=examples(60), deadline=None)
@given(MESSAGES, st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=4), TEXTS)
def test_growing_counts_equal_the_whole_count(messages: list[dict[str, Any]], steps: list[int], edit: str) -> None:
    method = LlamaCppTemplate()
    ends = sorted({min(sum(steps[: index + 1]), len(messages)) for index in range(len(steps))} | {len(messages)})
    for end in ends:
        assert count(method, messages[:end]) == fake_tokens(render(messages[:end], generation=True))
    # An earlier message edited: its rendering no longer matches what was remembered, and the count stays whole.
    edited = [{**messages[0], "content": str(messages[0]["content"]) + edit + "!"}, *messages[1:]]
    assert count(method, edited) == fake_tokens(render(edited, generation=True))
