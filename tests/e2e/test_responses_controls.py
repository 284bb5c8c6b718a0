"""The Responses API through the proxy: the same controls and guarantees as chat completions.

Provider compaction items are dropped first, conversations kept at the provider get what the operator configured,
an overflow the upstream reports is learned and retried, and the per-request switches and observe mode behave as
they do for chat completions.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from tests.support.openai_upstream import OpenAIUpstream
from tests.support.proxies import LoopbackProxies
from tests.support.responses_api import default_responses_responder, responses_tool_loop_responder

MODEL = "gpt-4.1"
TOOLS: list[Any] = [{"type": "function", "name": "read_file", "parameters": {"type": "object", "properties": {}}}]


@pytest.fixture
async def upstream() -> AsyncIterator[OpenAIUpstream]:
    async with OpenAIUpstream(context_window=32_000, responses_responder=default_responses_responder) as fake:
        yield fake


@pytest.fixture
async def proxies(upstream: OpenAIUpstream) -> AsyncIterator[LoopbackProxies]:
    started = LoopbackProxies(upstream=upstream.base_url, context_windows={MODEL: 32_000})
    yield started
    await started.close()


async def post(url: str, body: dict[str, Any], **headers: str) -> tuple[int, dict[str, str], Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/responses", json=body, headers={"Authorization": "Bearer sk-a", **headers}) as r,
    ):
        return r.status, dict(r.headers), await r.json()


def carried(response: Any) -> list[dict[str, Any]]:
    return [item for item in response["output"]]


def tool_history(steps: int, output_words: int) -> list[dict[str, Any]]:
    """A task and `steps` tool rounds with large outputs, as the client keeps them."""
    items: list[dict[str, Any]] = [{"role": "user", "content": "Read the files and report."}]
    for step in range(steps):
        items.append({"type": "function_call", "call_id": f"c{step}", "name": "read_file", "arguments": "{}"})
        items.append({"type": "function_call_output", "call_id": f"c{step}", "output": "word " * output_words})
    return items


async def test_a_carried_compaction_item_makes_what_it_stands_for_go_first(
    upstream: OpenAIUpstream, proxies: LoopbackProxies
) -> None:
    story: list[dict[str, Any]] = [{"role": "user", "content": "story " * 1500}]
    management = [{"type": "compaction", "compact_threshold": 500}]
    _status, _headers, compacted = await post(
        upstream.base_url + "/v1", {"model": MODEL, "input": story, "store": False, "context_management": management}
    )
    assert compacted["output"][0]["type"] == "compaction"
    proxy = await proxies.start()
    follow_up = {"role": "user", "content": "and then?"}
    body = {"model": MODEL, "input": [*story, *carried(compacted), follow_up], "store": False}
    # A compaction item shows a client that compacts itself, deferred to until it would not fit: not here.
    ignored = {"X-Context-Window": "2000", "X-Compaction-Client": "ignore"}
    status, headers, answer = await post(proxy.url, body, **ignored)
    assert status == 200, answer
    assert headers["X-Compaction"] == "compacted"
    assert headers["X-Compaction-Strategies"] == "provider_compaction"
    assert upstream.responses_requests[-1]["input"] == [*carried(compacted), follow_up]


@pytest.mark.parametrize(
    ("mode", "header", "added"),
    [
        ("off", "provider-state", {}),
        (
            "compaction",
            "provider-compaction",
            {"context_management": [{"type": "compaction", "compact_threshold": 1400}]},
        ),
        ("truncation", "provider-truncation", {"truncation": "auto"}),
    ],
)
async def test_a_conversation_kept_at_the_provider_gets_what_the_operator_chose(
    upstream: OpenAIUpstream, proxies: LoopbackProxies, mode: str, header: str, added: dict[str, Any]
) -> None:
    proxy = await proxies.start(provider_state=mode, context_windows={MODEL: 2000})
    status, headers, first = await post(proxy.url, {"model": MODEL, "input": "hello"})
    assert status == 200 and headers["X-Compaction"] == "unchanged"
    small = {"model": MODEL, "input": "again", "previous_response_id": first["id"]}
    status, headers, second = await post(proxy.url, small)
    assert (status, headers["X-Compaction"]) == (200, "provider-state")
    assert upstream.responses_requests[-1] == small
    over = {"model": MODEL, "input": "word " * 1500, "previous_response_id": second["id"]}
    status, headers, _ = await post(proxy.url, over)
    assert (status, headers["X-Compaction"]) == (200, header)
    assert upstream.responses_requests[-1] == {**over, **added}
    managed = {**over, "truncation": "auto"}
    status, headers, _ = await post(proxy.url, managed)
    assert headers["X-Compaction"] == "provider-state"
    assert upstream.responses_requests[-1] == managed, "the client's own context management is left alone"


async def test_an_overflow_without_a_stated_window_is_learned_and_retried(
    upstream: OpenAIUpstream, proxies: LoopbackProxies
) -> None:
    upstream.context_window = 3000
    proxy = await proxies.start()  # believes the model has 32,000 tokens
    items = tool_history(steps=8, output_words=500)
    status, headers, answer = await post(proxy.url, {"model": MODEL, "input": items, "tools": TOOLS})
    assert status == 200, answer
    assert headers["X-Compaction"] == "compacted-after-overflow"
    rejected, retried = upstream.responses_requests[-2:]
    assert rejected["input"] == items and retried["input"] != items
    # Learned: the next turn is sized against the learned window (the rewrite replayed), with no second overflow.
    items += [{"type": "function_call", "call_id": "c9", "name": "read_file", "arguments": "{}"}]
    items += [{"type": "function_call_output", "call_id": "c9", "output": "word " * 500}]
    sent = len(upstream.responses_requests)
    status, headers, answer = await post(proxy.url, {"model": MODEL, "input": items, "tools": TOOLS})
    assert status == 200, answer
    assert int(headers["X-Compaction-Context-Window"]) < 32_000
    assert headers["X-Compaction-Window-Source"] == "learned"
    assert len(upstream.responses_requests) == sent + 1


async def test_off_switch_and_observe_mode_forward_the_clients_bytes(
    upstream: OpenAIUpstream, proxies: LoopbackProxies
) -> None:
    body = {"model": MODEL, "input": tool_history(steps=8, output_words=500), "tools": TOOLS}
    raw = json.dumps(body).encode()
    for settings, headers, expected in (
        ({}, {"X-Compaction": "off"}, "skipped"),
        ({"mode": "observe"}, {}, "would-compact"),
    ):
        proxy = await proxies.start(context_windows={MODEL: 4000}, **settings)
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                proxy.url + "/responses", data=raw, headers={"Content-Type": "application/json", **headers}
            ) as response,
        ):
            assert response.headers["X-Compaction"] == expected
        assert upstream.requests[-1].body == raw


async def test_an_sdk_agent_with_reasoning_streams_through_a_compacting_proxy(
    upstream: OpenAIUpstream, proxies: LoopbackProxies
) -> None:
    upstream.responses_responder = responses_tool_loop_responder("read_file", steps=6)
    # Pruning's placeholder is what this run checks (offloading's pointers, with their preview, fill a 3k window).
    proxy = await proxies.start(context_windows={MODEL: 3000}, offload=False)
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0) as client:
        items: list[dict[str, Any]] = [{"role": "user", "content": "Review the module."}]
        # Until the model answers (at most 10 turns): how many it takes depends on what the chain keeps at 3,000 tokens.
        for _turn in range(10):
            stream = await client.responses.create(
                model=MODEL, input=items, tools=TOOLS, store=False, include=["reasoning.encrypted_content"], stream=True
            )
            final = None
            async for event in stream:
                if event.type == "response.completed":
                    final = event.response
            assert final is not None
            output = [item.model_dump(exclude_none=True) for item in final.output]
            items += output
            items += [
                {"type": "function_call_output", "call_id": item["call_id"], "output": "line\n" * 300}
                for item in output
                if item["type"] == "function_call"
            ]
            if final.output_text:
                break
    assert final.output_text.startswith("done")
    forwarded = json.dumps(upstream.responses_requests[-1]["input"])
    assert "to free up context" in forwarded, "the run was compacted"


async def test_an_overflow_inside_the_stream_is_retried_before_the_client_sees_it(
    upstream: OpenAIUpstream, proxies: LoopbackProxies
) -> None:
    upstream.context_window = 3000
    upstream.responses_overflow_in_stream = True
    proxy = await proxies.start()  # believes the model has 32,000 tokens
    items = tool_history(steps=8, output_words=500)
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0) as client:
        raw = await client.responses.with_raw_response.create(model=MODEL, input=items, tools=TOOLS, stream=True)  # type: ignore[arg-type]
        events = [event.type async for event in raw.parse()]
    assert raw.headers["X-Compaction"] == "compacted-after-overflow"
    assert "error" not in events and events[-1] == "response.completed"
    assert events[:2] == ["response.created", "response.in_progress"]
    assert len(upstream.responses_requests) == 2
