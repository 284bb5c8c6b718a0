"""A small Messages request is decided on its byte size only when its bytes bound every token the API counts.

`proxy.pipeline.byte_bound` forwards a small request untouched when `len(body)` plus the tool-use system prompt (which
no byte shows) is under the trigger. Over random text conversations (any Unicode, tool calls with any input, tool
results as text or text blocks, system as text or blocks, tools forced or not) the bound is never below what the
proxy counts for the request nor what the strict fake upstream counts; a conversation with any block that is not
text or a tool call (thinking, images, documents, server tools, unknown blocks) is never bounded by its bytes. What
a request reads from the engine's messages its blocks map onto (`text_only`, its compaction blocks) is what the
blocks say, and its last message is the mapping's last.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.engine import counter_for_model
from proxy.formats.anthropic.request import MessagesRequest
from proxy.pipeline.byte_bound import bytes_bound
from proxy.pipeline.requests import text_only
from proxy.simulator.anthropic_rules import Signer, prompt_segments
from tests.support.anthropic_conversations import TOOLS, Built, conversations
from tests.support.examples import examples

SIGNER = Signer(b"k" * 32)
MODEL = "claude-sonnet-4-5"

texts = st.text(max_size=120)
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10)
text_blocks = st.lists(st.builds(lambda text: {"type": "text", "text": text}, texts), min_size=1, max_size=3)
inputs = st.dictionaries(names, texts | st.integers(-(2**53), 2**53) | st.lists(texts, max_size=2), max_size=3)


@st.composite
def text_conversations(draw: st.DrawFn) -> dict[str, Any]:
    """A Messages request of text, tool calls and their text results only."""
    messages: list[dict[str, Any]] = []
    for turn in range(draw(st.integers(1, 4))):
        messages.append({"role": "user", "content": draw(texts | text_blocks)})
        ids = [f"toolu_{turn}_{call}" for call in range(draw(st.integers(0, 2)))]
        calls = [{"type": "tool_use", "id": call, "name": draw(names), "input": draw(inputs)} for call in ids]
        messages.append({"role": "assistant", "content": draw(text_blocks) * draw(st.integers(0, 1)) + calls})
        if ids:
            contents = [draw(texts | text_blocks) for _ in ids]
            results = [
                {"type": "tool_result", "tool_use_id": call, "content": content}
                for call, content in zip(ids, contents, strict=True)
            ]
            messages.append({"role": "user", "content": results})
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 1024, "messages": messages}
    system = draw(st.none() | texts | text_blocks)
    if system is not None:
        body["system"] = system
    if draw(st.booleans()):
        body["tools"] = TOOLS
        body["tool_choice"] = draw(st.sampled_from([{"type": "auto"}, {"type": "any"}, {"type": "none"}]))
    return body


def bound_of(body: dict[str, Any], indented: bool = False) -> tuple[int | None, MessagesRequest]:
    raw = orjson.dumps(body, option=orjson.OPT_INDENT_2 if indented else 0)
    request = MessagesRequest.parse(raw)
    bound = bytes_bound(raw, 1.0, request.added_prompt_tokens) if request.text_only else None
    # What the request reads from its blocks is what the engine's messages they map to say.
    assert request.text_only == text_only(request.messages) == (bound is not None)
    return bound, request


@settings(max_examples=examples(200), deadline=None)
@given(body=text_conversations(), indented=st.booleans())
def test_a_text_conversation_counts_no_more_tokens_than_its_bound(body: dict[str, Any], indented: bool) -> None:
    bound, request = bound_of(body, indented)
    assert bound is not None
    counter = counter_for_model(MODEL)
    local = counter.messages_tokens(request.messages) + counter.overhead_tokens(request.overhead_fields)
    assert bound >= local + request.added_prompt_tokens
    assert bound >= sum(segment.tokens for segment in prompt_segments(body, body["messages"]))


@settings(max_examples=examples(100), deadline=None)
@given(built=conversations(SIGNER))
def test_a_conversation_with_other_blocks_is_never_bounded_by_its_bytes(built: Built) -> None:
    bound, _ = bound_of(built.body)
    kinds = {
        block.get("type")
        for message in built.body["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
    }
    assert bound is None or kinds <= {"text", "tool_use", "tool_result"}
    if bound is not None:
        assert bound >= sum(segment.tokens for segment in prompt_segments(built.body, built.body["messages"]))


blocks = st.one_of(
    text_blocks.map(lambda listed: listed[0]),
    st.builds(lambda text: {"type": "text", "text": text, "citations": []}, texts),
    st.just({"type": "text", "text": 3}),
    st.builds(lambda name: {"type": "tool_use", "id": "toolu_1", "name": name, "input": {}}, names),
    st.builds(
        lambda content: {"type": "tool_result", "tool_use_id": "toolu_1", "content": content},
        st.none() | texts | text_blocks,
    ),
    st.just({"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "image", "source": {}}]}),
    st.just({"type": "thinking", "thinking": "hm", "signature": "s"}),
    st.just({"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}),
    st.just({"type": "mystery", "payload": 1}),
    st.just({"type": "compaction", "content": "Summary."}),
    st.just({"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "compaction", "content": "S."}]}),
    st.just("not a block"),
)


@settings(max_examples=examples(300), deadline=None)
@given(
    system=st.none() | texts | st.lists(blocks, max_size=2),
    messages=st.lists(
        st.builds(
            lambda role, content: {"role": role, "content": content},
            st.sampled_from(["user", "assistant", "system", "robot"]),
            st.none() | texts | st.lists(blocks, max_size=3),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_what_is_read_from_the_mapping_is_what_the_blocks_say(system: Any, messages: list[Any]) -> None:
    """`text_only` and the `compaction-items` signal, read from the engine's messages, say what the blocks say."""
    body = {"model": MODEL, "max_tokens": 8, "messages": messages, **({"system": system} if system is not None else {})}
    request = MessagesRequest.parse(orjson.dumps(body))
    sent = [(None, system), *((message["role"], message["content"]) for message in messages)]
    listed = [(role, content) for role, content in sent if isinstance(content, list)]
    assert request.text_only == all(_text_or_call(block, role) for role, content in listed for block in content)
    holds = any(_compaction_in(block, role) for role, content in listed for block in content)
    assert (request.compaction_signal == "compaction-items") == holds
    assert request.last_message is (request.messages[-1] if request.messages else None)


def _is_text(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)


def _text_or_call(block: Any, role: str | None) -> bool:
    """A text block, an assistant's tool call, or a user's tool result of text: what a byte bound holds for."""
    kind = block.get("type") if isinstance(block, dict) else None
    if _is_text(block) or (kind == "tool_use" and role == "assistant"):
        return True
    content = block.get("content") if kind == "tool_result" and role == "user" else None
    return kind == "tool_result" and role == "user" and (not isinstance(content, list) or all(map(_is_text, content)))


def _compaction_in(block: Any, role: str | None) -> bool:
    """A `compaction` block, or one in a user's tool result (mapped with its content)."""
    kind = block.get("type") if isinstance(block, dict) else None
    content = block.get("content") if kind == "tool_result" and role == "user" else None
    inner = isinstance(content, list) and any(
        isinstance(item, dict) and item.get("type") == "compaction" for item in content
    )
    return kind == "compaction" or inner
