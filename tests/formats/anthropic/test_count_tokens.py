"""`CountTokens`, the Messages API's `count_tokens` as an exact-count source, against the strict fake upstream.

The count is what the upstream's messages endpoint counts for the same request (as forwarded: a compacted view is
counted as it will be sent), asked with the caller's credential and version headers, remembered per tenant and
body; a 429 backs the tenant off for at least its `retry-after`, and only that tenant; a request the endpoint finds
invalid backs nothing off; off unless `count_probes` names it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from proxy.config import Settings
from proxy.discovery.budgeted import Outcome
from proxy.engine import Anchor
from proxy.engine.plan import EditPlan
from proxy.formats.anthropic.count_tokens import PROBE, CountTokens
from proxy.formats.anthropic.request import MessagesRequest
from proxy.pipeline.capabilities import CountQuestion
from proxy.pipeline.exact_counts import MAX_COUNTED_BYTES
from proxy.pipeline.rewrites import View
from proxy.simulator.anthropic_rules import prompt_segments
from proxy.simulator.anthropic_upstream import AnthropicUpstream
from tests.support.anthropic_agent import SYSTEM, TOOLS

HEADERS = {"x-api-key": "sk-ant-alice", "anthropic-version": "2023-06-01", "anthropic-beta": "a-beta"}
MODEL = "claude-sonnet-4-5"


class Clock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def upstream() -> AsyncIterator[AnthropicUpstream]:
    async with AnthropicUpstream(api_keys=frozenset({"sk-ant-alice", "sk-ant-bob"})) as fake:
        yield fake


def body(turns: int = 3) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for turn in range(turns):
        messages += [
            {"role": "user", "content": f"Question {turn}: " + "detail " * 50},
            {"role": "assistant", "content": [{"type": "text", "text": f"Answer {turn}: " + "point " * 50}]},
        ]
    messages.append({"role": "user", "content": "Go on."})
    return {"model": MODEL, "max_tokens": 512, "system": SYSTEM, "tools": TOOLS, "messages": messages}


def unchanged(request: MessagesRequest) -> View:
    """The view of a request nothing was remembered for: the client's own messages."""
    return View(request.messages, [], None, EditPlan.identity(len(request.messages)), [], [])


def source(upstream: AnthropicUpstream, clock: Clock | None = None, **settings: Any) -> CountTokens:
    configured = Settings(upstream=upstream.base_url, count_probes=[PROBE], exact_count_timeout=5.0, **settings)
    return CountTokens(configured, clock=clock or Clock())


async def count(
    counts: CountTokens,
    request: MessagesRequest,
    view: View,
    tenant: bytes = b"alice",
    key: str | None = None,
    *,
    size: int = 0,
    usage: Anchor | None = None,
) -> tuple[Anchor | None, Outcome | str | None]:
    headers = {**HEADERS, "x-api-key": key} if key else HEADERS
    counted = await counts.count(CountQuestion(MODEL, request, view, tenant, headers, size=size, usage=usage))
    return counted.anchor, counted.outcome


async def test_the_count_is_what_the_messages_endpoint_counts(upstream: AnthropicUpstream) -> None:
    document = body()
    request = MessagesRequest.parse(orjson.dumps(document))
    counts = source(upstream)
    try:
        anchor, outcome = await count(counts, request, unchanged(request))
        again, cached = await count(counts, request, unchanged(request))
    finally:
        await counts.aclose()
    expected = sum(segment.tokens for segment in prompt_segments(document, document["messages"]))
    assert outcome == Outcome.COUNTED and anchor is not None
    assert (anchor.tokens, anchor.covered) == (expected, len(request.messages))
    assert again == anchor and cached == Outcome.CACHED and len(upstream.count_requests) == 1
    sent, headers = upstream.count_requests[0]
    assert set(sent) == {"model", "system", "tools", "messages"}
    assert {name: headers[name] for name in HEADERS} == HEADERS


async def test_a_compacted_view_is_counted_as_it_is_forwarded(upstream: AnthropicUpstream) -> None:
    request = MessagesRequest.parse(orjson.dumps(body()))
    kept = [request.messages[0], *request.messages[-1:]]  # the system and the latest user message
    view = View(kept, [], [{}, {}], EditPlan.identity(len(kept)), [], [])
    counts = source(upstream)
    try:
        anchor, _ = await count(counts, request, view)
    finally:
        await counts.aclose()
    sent, _ = upstream.count_requests[0]
    assert sent["messages"] == [{"role": "user", "content": "Go on."}] and sent["system"] == SYSTEM
    assert anchor is not None and anchor.tokens == sum(
        segment.tokens for segment in prompt_segments(sent, sent["messages"])
    )


async def test_a_rate_limit_backs_off_that_tenant_for_its_retry_after(upstream: AnthropicUpstream) -> None:
    request = MessagesRequest.parse(orjson.dumps(body()))
    clock = Clock()
    counts = source(upstream, clock)
    upstream.count_refusals = 1
    try:
        assert await count(counts, request, unchanged(request)) == (None, Outcome.FAILED)
        assert not counts.may_ask(b"alice") and counts.may_ask(b"bob")
        clock.now += 29
        assert await count(counts, request, unchanged(request)) == (None, Outcome.FAILED)
        assert len(upstream.count_requests) == 1, "asked while the rate limit lasted"
        other, _ = await count(counts, request, unchanged(request), b"bob", "sk-ant-bob")
        assert other is not None, "another tenant waited on alice's rate limit"
        clock.now += 31  # past retry-after (30 s), and the chat methods' first back-off (60 s) in all
        anchor, outcome = await count(counts, request, unchanged(request))
    finally:
        await counts.aclose()
    assert outcome == Outcome.COUNTED and anchor is not None and len(upstream.count_requests) == 3


async def test_a_request_the_endpoint_refuses_backs_nothing_off(upstream: AnthropicUpstream) -> None:
    request = MessagesRequest.parse(orjson.dumps({**body(), "messages": [{"role": "robot", "content": "hi"}]}))
    counts = source(upstream)
    try:
        assert (await count(counts, request, unchanged(request)))[0] is None
        assert counts.may_ask(b"alice")
    finally:
        await counts.aclose()


async def test_a_wrong_credential_backs_off_and_counting_is_opt_in(upstream: AnthropicUpstream) -> None:
    request = MessagesRequest.parse(orjson.dumps(body()))
    counts = source(upstream)
    off = CountTokens(Settings(upstream=upstream.base_url))
    try:
        assert (await count(counts, request, unchanged(request), key="sk-ant-mallory"))[0] is None
        assert not counts.may_ask(b"alice")
        assert await count(off, request, unchanged(request)) == (None, None)
    finally:
        await counts.aclose()
        await off.aclose()
    assert len(upstream.count_requests) == 1


async def test_nothing_is_asked_where_the_usage_report_covers_the_conversation(upstream: AnthropicUpstream) -> None:
    """A report of all but the last short message is as good as a count: the rate-limited endpoint is spared."""
    request = MessagesRequest.parse(orjson.dumps(body()))
    view = unchanged(request)
    counts = source(upstream)
    try:
        covering = Anchor(tokens=2000, covered=len(view.messages) - 1)
        assert await count(counts, request, view, usage=covering) == (None, "reported")
        assert await count(counts, request, view, size=MAX_COUNTED_BYTES + 1) == (None, None)
        assert upstream.count_requests == []
        _, outcome = await count(counts, request, view, usage=Anchor(tokens=2000, covered=1))
    finally:
        await counts.aclose()
    assert outcome == Outcome.COUNTED and len(upstream.count_requests) == 1
