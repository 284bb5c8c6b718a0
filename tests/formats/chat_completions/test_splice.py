"""A request recognized from its bytes is handled exactly as the full path handles it, and only then.

The same turns of random conversations go through two services, one recognizing each next request from its bytes
and one parsing every request in full (the reference). Whatever the client does (grows the conversation, re-sends it
as it was, edits an earlier message, changes a field, re-serializes with other spacing) and whatever the proxy does
(compacts with a small window, replays the rewrite, asks a stream for its usage, only observes) and whether or not
the upstream reports usage, both forward the same bytes with the same headers and anchor the provider's usage on the
same chains.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.config import Mode, Settings
from proxy.engine import counter_for_model
from proxy.formats.chat_completions.request import ChatRequest
from proxy.formats.chat_completions.splice import Splices
from proxy.formats.chat_completions.wire import CHAT_COMPLETIONS
from proxy.pipeline.exchange import ForwardPlan, IncomingRequest, Refusal, UpstreamOutcome
from proxy.pipeline.off_loop import OffLoop
from proxy.pipeline.requests import RequestLimits
from proxy.pipeline.service import CompactionPipeline
from proxy.pipeline.turn import Turn
from tests.engine.conversations import conversations
from tests.support.examples import examples

MODEL = "gpt-4o-mini"
HEADERS = {"Authorization": "Bearer sk-splice"}

Serializer = Callable[[dict[str, Any]], bytes]

SERIALIZERS: dict[str, Serializer] = {
    "orjson": orjson.dumps,
    "python": lambda body: json.dumps(body).encode(),
    "indented": lambda body: json.dumps(body, indent=2, ensure_ascii=False).encode(),
    "spaced": lambda body: json.dumps(body, separators=(", ", ":"), ensure_ascii=False).encode(),
}

EXTRA_FIELDS: dict[str, Any] = {
    "temperature": 0.3,
    "stream": True,
    "stream_options": {"include_usage": False},
    "tools": [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}],
    "user": 'a ] } " [ { user',
}


def request_body(fields: dict[str, Any], position: int, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The body with `messages` among `fields` at `position`, as a client lays it out."""
    items = list(fields.items())
    items.insert(min(position, len(items)), ("messages", messages))
    return dict(items)


@st.composite
def turns(draw: st.DrawFn) -> list[tuple[str, int]]:
    """What the client does each turn: (`grow` | `edit` | `field` | `respace`, messages to add)."""
    actions = st.sampled_from(["grow"] * 6 + ["edit", "field", "respace"])
    return draw(st.lists(st.tuples(actions, st.sampled_from([0, 1, 1, 2, 3])), min_size=2, max_size=10))


def outcome(body: bytes) -> UpstreamOutcome:
    """A plausible usage report for what was forwarded."""
    sent = orjson.loads(body)["messages"]
    prompt = counter_for_model(MODEL).messages_tokens(sent) + 3
    return UpstreamOutcome(
        status=200, usage={"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5}
    )


def assert_same(spliced: ForwardPlan | Refusal, full: ForwardPlan | Refusal) -> None:
    assert type(spliced) is type(full)
    if isinstance(spliced, Refusal):
        assert spliced == full
        return
    assert isinstance(full, ForwardPlan)
    assert spliced.body == full.body
    assert spliced.response_headers == full.response_headers
    assert (spliced.stream, spliced.strip_usage_chunk) == (full.stream, full.strip_usage_chunk)
    assert getattr(spliced.context, "sent", None) == getattr(full.context, "sent", None)


def stored(service: CompactionPipeline) -> tuple[dict[bytes, Any], dict[bytes, Any]]:
    """The anchors and rewrites the service's in-memory store holds."""
    store: Any = service.store
    anchors = {key: value for key, (_expires, value, _cost) in store.anchors._entries.items()}
    rewrites = {key: value for key, (_expires, value, _cost) in store.rewrites._entries.items()}
    return anchors, rewrites


@settings(max_examples=examples(100), deadline=None)
@given(
    conversation=conversations(max_turns=5, max_steps=3),
    plan=turns(),
    extra=st.lists(st.sampled_from(sorted(EXTRA_FIELDS)), unique=True),
    position=st.integers(min_value=0, max_value=6),
    style=st.sampled_from(sorted(SERIALIZERS)),
    window=st.sampled_from([800, 1_500, 3_000, 100_000]),
    mode=st.sampled_from([Mode.ENFORCE, Mode.ENFORCE, Mode.OBSERVE]),
    reported=st.sampled_from([True, True, False]),
)
async def test_a_spliced_request_is_forwarded_exactly_as_the_full_path_forwards_it(  # noqa: PLR0917
    conversation: Any,
    plan: list[tuple[str, int]],
    extra: list[str],
    position: int,
    style: str,
    window: int,
    mode: Mode,
    reported: bool,
) -> None:
    config = Settings(context_windows={MODEL: window}, compact_at=0.7, compact_to=0.4, mode=mode)
    spliced_service = CompactionPipeline(config, splice_from=0)
    full_service = CompactionPipeline(config, splice_from=None)
    history = conversation.messages
    fields: dict[str, Any] = {"model": MODEL, **{name: EXTRA_FIELDS[name] for name in extra}}
    serialize = SERIALIZERS[style]
    styles_used = {style}
    sent = min(len(history), 2)
    recognized = 0
    for number, (action, added) in enumerate(plan):
        messages = [dict(message) for message in history[: max(sent, 1)]]
        if not messages:
            return
        if action == "edit":
            messages[0]["content"] = f"edited {number}"
            history = [messages[0], *history[1:]]
        elif action == "field":
            fields["temperature"] = number + 0.5
        elif action == "respace":
            style = sorted(SERIALIZERS)[(sorted(SERIALIZERS).index(style) + 1) % len(SERIALIZERS)]
            serialize = SERIALIZERS[style]
        body = serialize(request_body(fields, position, messages))
        chat = IncomingRequest(body=body, headers=HEADERS, path="/v1/chat/completions", wire=CHAT_COMPLETIONS)
        spliced, full = await spliced_service.prepare(chat), await full_service.prepare(chat)
        assert_same(spliced, full)
        turn = getattr(spliced.context, "turn", None) if isinstance(spliced, ForwardPlan) else None
        extension = turn.extension if turn else None
        if number > 0 and (action in {"edit", "field"} or (action == "respace" and style not in styles_used)):
            assert extension is None, "an edited, changed or respaced request must take the full path"
        styles_used.add(style)
        recognized += extension is not None
        if reported and isinstance(full, ForwardPlan) and full.context is not None:
            reply = outcome(full.body)
            await spliced_service.complete(spliced, reply)  # type: ignore[arg-type]
            await full_service.complete(full, reply)
        assert stored(spliced_service) == stored(full_service)
        sent = min(len(history), sent + added)
    if all(action == "grow" for action, _added in plan) and len(history) > 1:
        assert recognized == len(plan) - 1, "every request after the first extends the one before it"


@settings(max_examples=examples(50), deadline=None)
@given(sizes=st.lists(st.integers(min_value=1, max_value=3_000), min_size=1, max_size=30))
async def test_what_is_remembered_never_costs_more_than_its_budget(sizes: list[int]) -> None:
    splices = Splices(RequestLimits(max_messages=100, max_content_parts=100), max_bytes=40_000, on_failure=pytest.fail)
    for number, size in enumerate(sizes):
        raw = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": f"{number} " + "x" * size}]})
        await splices.remember(b"tenant", raw, ChatRequest.parse(raw), Turn(), OffLoop())
        assert splices._recent.cost <= 40_000
    assert splices._recent.cost > 0
