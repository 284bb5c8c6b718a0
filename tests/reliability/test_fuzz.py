"""Hostile input: malformed chat-completion bodies never produce a traceback or a 500 of ours.

A hypothesis fuzzer posts invalid JSON, invalid UTF-8, wrong types, unknown roles and content parts, huge numbers,
deep nesting and huge strings to the real proxy (real compaction service, a small window so compaction engages).
Each request is either forwarded untouched (and the fake upstream answers, 400 for what OpenAI rejects) or, when the
proxy could parse and compact it, forwarded as a valid rewrite; the answer is OpenAI-shaped; nothing is logged at
ERROR; and the server keeps serving. The engine is also fed hostile messages directly (Transcript and the chain).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from proxy.config import Settings
from proxy.engine import STRATEGY_NAMES, Thresholds, Transcript, chain_by_names, compact_if_needed, counter_for_model
from proxy.formats.chat_completions.request import ChatRequest
from proxy.pipeline.requests import InvalidRequest
from proxy.pipeline.service import CompactionPipeline
from proxy.server import create_app
from proxy.server.log_formats import JsonFormatter
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.support.examples import examples

MODEL = "gpt-4o-mini"
WINDOW = 2048
FUZZ_EXAMPLES = examples(300)


@dataclass
class Running:
    """The proxy and the upstream on a loop of the module's own, for hypothesis's synchronous test functions."""

    loop: asyncio.AbstractEventLoop
    upstream: OpenAIUpstream
    server: TestServer
    http: aiohttp.ClientSession
    errors: list[logging.LogRecord] = field(default_factory=list)
    tried: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}/v1/chat/completions"

    def post(
        self, body: bytes, headers: dict[str, str] | None = None, path: str = "/chat/completions"
    ) -> tuple[int, bytes]:
        url = f"http://127.0.0.1:{self.server.port}/v1{path}"

        async def send() -> tuple[int, bytes]:
            async with self.http.post(url, data=body, headers=headers or {}) as response:
                return response.status, await response.read()

        return self.loop.run_until_complete(send())


class _ErrorCollector(logging.Handler):
    """Keeps every record at ERROR or above, rendered as the proxy renders its logs (checks the formatter too)."""

    def __init__(self, sink: list[logging.LogRecord]) -> None:
        super().__init__(logging.ERROR)
        self.sink = sink
        self.setFormatter(JsonFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        self.format(record)
        self.sink.append(record)


@pytest.fixture(scope="module")
def running() -> Iterator[Running]:
    loop = asyncio.new_event_loop()
    upstream = OpenAIUpstream(context_window=1_000_000)
    loop.run_until_complete(upstream.start())
    proxy_settings = Settings(
        upstream=upstream.base_url, context_windows={MODEL: WINDOW}, window_probes=[], count_probes=[]
    )
    server = TestServer(create_app(proxy_settings, CompactionPipeline(proxy_settings)), host="127.0.0.1", port=0)
    loop.run_until_complete(server.start_server())

    async def session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(headers={"Authorization": "Bearer sk-fuzz"})

    state = Running(loop, upstream, server, loop.run_until_complete(session()))
    # Clients earlier tests left to the garbage collector log their own errors when finalized (an SDK's HTTP client
    # closing on a loop that is gone): finalize them now, before listening for the proxy's.
    gc.collect()
    collector = _ErrorCollector(state.errors)
    logging.getLogger().addHandler(collector)
    try:
        yield state
    finally:
        logging.getLogger().removeHandler(collector)
        print(f"\nFUZZ FIGURES http_cases={state.tried}")
        loop.run_until_complete(state.http.close())
        loop.run_until_complete(server.close())
        loop.run_until_complete(upstream.close())
        loop.close()


# ---- what to throw ------------------------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=50),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "", "root", "USER", "🤖"])
content_parts = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "input_audio", "file", "video", "", "refusal"])},
    optional={
        "text": st.one_of(st.text(max_size=200), json_values),
        "image_url": st.one_of(json_values, st.fixed_dictionaries({"url": st.text(max_size=80)})),
        "detail": json_values,
    },
)
tool_calls = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "id": st.one_of(st.text(max_size=12), json_values),
            "type": st.just("function"),
            "function": st.one_of(
                json_values,
                st.fixed_dictionaries({"name": st.text(max_size=10), "arguments": st.one_of(st.text(), json_values)}),
            ),
        },
    ),
    max_size=3,
)
messages = st.fixed_dictionaries(
    {},
    optional={
        "role": st.one_of(roles, json_values),
        "content": st.one_of(st.text(max_size=2000), st.lists(content_parts, max_size=4), json_values),
        "name": st.one_of(st.text(max_size=20), json_values),
        "tool_calls": st.one_of(tool_calls, json_values),
        "tool_call_id": st.one_of(st.text(max_size=12), json_values),
        "function_call": json_values,
    },
)
chat_bodies = st.fixed_dictionaries(
    {"messages": st.one_of(st.lists(messages, max_size=12), json_values)},
    optional={
        "model": st.one_of(st.just(MODEL), st.text(max_size=20), json_values),
        "stream": st.one_of(st.booleans(), json_values),
        "stream_options": json_values,
        "tools": json_values,
        "max_tokens": st.one_of(st.integers(min_value=-(10**30), max_value=10**30), json_values),
    },
)


item_types = st.sampled_from(
    [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "compaction",
        "web_search_call",
        "item_reference",
        "",
        "mystery",
    ]
)
items = st.fixed_dictionaries(
    {},
    optional={
        "type": st.one_of(item_types, json_values),
        "role": st.one_of(roles, json_values),
        "content": st.one_of(st.text(max_size=2000), st.lists(content_parts, max_size=4), json_values),
        "call_id": st.one_of(st.sampled_from(["c1", "c2"]), json_values),
        "name": st.one_of(st.text(max_size=10), json_values),
        "arguments": st.one_of(st.text(max_size=50), json_values),
        "output": st.one_of(st.text(max_size=2000), json_values),
        "summary": json_values,
        "encrypted_content": st.one_of(st.text(max_size=200), json_values),
    },
)
responses_bodies = st.fixed_dictionaries(
    {"input": st.one_of(st.lists(items, max_size=12), st.text(max_size=3000), json_values)},
    optional={
        "model": st.one_of(st.just(MODEL), json_values),
        "instructions": st.one_of(st.text(max_size=500), json_values),
        "stream": st.one_of(st.booleans(), json_values),
        "previous_response_id": st.one_of(st.text(max_size=10), json_values),
        "tools": json_values,
        "max_output_tokens": st.one_of(st.integers(min_value=-(10**30), max_value=10**30), json_values),
    },
)


def _encode(document: Any) -> bytes:
    return json.dumps(document).encode()  # Python's json: big integers and all, as a client might send them


raw_bodies = st.one_of(
    chat_bodies.map(_encode),
    json_values.map(_encode),
    st.binary(max_size=300),
    chat_bodies.map(_encode).flatmap(  # valid JSON cut short or with garbage spliced in
        lambda body: st.integers(0, max(len(body) - 1, 0)).flatmap(
            lambda cut: st.sampled_from([body[:cut], body[:cut] + b"\xff\xfe" + body[cut:], body[:cut] + b"}" * 3])
        )
    ),
)

DEEP = b'{"model": "gpt-4o-mini", "messages": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
DEEP_CONTENT = (
    b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": '
    + b'{"a": ' * 10_000
    + b"1"
    + b"}" * 10_000
    + b"}]}"
)
INVALID_UTF8 = b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "caf\xe9 \xff\xfe \xed\xa0\x80"}]}'
LONE_SURROGATE = b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "\\ud800 x"}]}'
HUGE_NUMBER = (
    b'{"model": "gpt-4o-mini", "max_tokens": 1' + b"0" * 5000 + b', "messages": [{"role": "user", "content": 1e999}]}'
)
HUGE_STRING = _encode({"model": MODEL, "messages": [{"role": "user", "content": "x" * 5_000_000}]})
HUGE_TOKENS = _encode(
    {
        "model": MODEL,
        "messages": [{"role": "system", "content": "s"}]
        + [{"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 3000} for i in range(20)],
    }
)


def _acceptable(running: Running, sent: bytes, status: int, answer: bytes, before: int) -> None:
    """The request was forwarded untouched (or as a valid rewrite) or refused by us with an OpenAI-style 400/413."""
    assert status in (200, 400, 404, 413), (status, answer[:300])
    if status != 200:
        error = json.loads(answer)["error"]
        assert isinstance(error["message"], str) and "type" in error and "code" in error
    new = running.upstream.requests[before:]
    if status == 413:
        assert new == []
        return
    assert len(new) == 1, (status, answer[:300])
    received = new[0].body
    if received != sent:
        # Only a request the proxy could parse is ever changed: then it was compacted or asked for usage.
        original = ChatRequest.parse(sent)
        rewritten = orjson.loads(received)
        assert {k: v for k, v in rewritten.items() if k not in ("messages", "stream_options")} == {
            k: v for k, v in original.body.items() if k not in ("messages", "stream_options")
        }
        assert isinstance(rewritten["messages"], list)


@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(body=raw_bodies)
@example(body=DEEP)
@example(body=DEEP_CONTENT)
@example(body=INVALID_UTF8)
@example(body=LONE_SURROGATE)
@example(body=HUGE_NUMBER)
@example(body=HUGE_STRING)
@example(body=HUGE_TOKENS)
@example(body=b"")
@example(body=b"null")
@example(body=b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": 5}}]}]}')
def test_hostile_chat_bodies_are_forwarded_or_refused_never_a_500(running: Running, body: bytes) -> None:
    before = len(running.upstream.requests)
    errors_before = len(running.errors)
    status, answer = running.post(body, {"Content-Type": "application/json"})
    running.tried += 1
    _acceptable(running, body, status, answer, before)
    new_errors = running.errors[errors_before:]
    assert not new_errors, [(r.name, r.getMessage(), r.exc_info and r.exc_info[0]) for r in new_errors]


@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(body=st.one_of(responses_bodies.map(_encode), st.binary(max_size=200)))
def test_hostile_responses_bodies_are_forwarded_or_refused_never_a_500(running: Running, body: bytes) -> None:
    before = len(running.upstream.requests)
    errors_before = len(running.errors)
    status, answer = running.post(body, {"Content-Type": "application/json"}, path="/responses")
    running.tried += 1
    assert status in (200, 400, 404, 413), (status, answer[:300])
    if status != 200:
        error = json.loads(answer)["error"]
        assert isinstance(error["message"], str) and "type" in error
    new = running.upstream.requests[before:]
    assert len(new) <= 2, "forwarded once, or retried once after an overflow"
    if new and new[0].body != body:
        # Only a request the proxy could parse is changed, and only its input and instructions.
        original, rewritten = orjson.loads(body), orjson.loads(new[0].body)
        assert {k: v for k, v in rewritten.items() if k not in ("input", "instructions")} == {
            k: v for k, v in original.items() if k not in ("input", "instructions")
        }
    new_errors = running.errors[errors_before:]
    assert not new_errors, [(r.name, r.getMessage(), r.exc_info and r.exc_info[0]) for r in new_errors]


def test_the_server_still_serves_after_the_fuzzing(running: Running) -> None:
    status, answer = running.post(_encode({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}))
    assert status == 200
    assert json.loads(answer)["choices"][0]["message"]["content"] == "ok 1 messages"


# ---- the engine, directly -----------------------------------------------------------------------------------------

ALL_STRATEGIES = [name for name in STRATEGY_NAMES if name != "summarization"]  # summarization needs a model to call


@settings(max_examples=examples(200), deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    conversation=st.lists(messages, min_size=1, max_size=15),
    window=st.integers(min_value=16, max_value=4096),
    model=st.sampled_from([MODEL, "gpt-4", "llama-3", "unknown-model"]),
)
def test_the_engine_takes_hostile_messages_without_raising(
    conversation: list[dict[str, Any]], window: int, model: str
) -> None:
    try:
        request = ChatRequest.parse(_encode({"model": model, "messages": conversation}))
    except InvalidRequest:
        return
    counter = counter_for_model(model)
    transcript = Transcript(request.messages, counter)
    outcome = compact_if_needed(
        transcript, Thresholds(window, 0.7, 0.4), chain_by_names(ALL_STRATEGIES), counter.overhead_tokens(request.body)
    )
    if outcome.result is not None:
        compacted = outcome.result.plan.apply_messages(request.messages)
        assert isinstance(compacted, list)
        orjson.dumps(compacted)  # still serializable: it is what goes upstream
