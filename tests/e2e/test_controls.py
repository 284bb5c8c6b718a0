"""What users steer and see, for every wire format: the off switch, windows, overflow retry, tenant isolation,
headers and metrics; then what only one format has (the Responses API's provider state and compaction items).

The Messages API's own controls (errors byte for byte, Claude Code's headers) are in `tests/e2e/messages/`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from proxy.pipeline.prepared import RELEASE_FROM_BYTES
from proxy.simulator.openai_upstream import OpenAIUpstream
from proxy.simulator.responses_api import responses_tool_loop_responder
from tests.support.proxies import LoopbackProxies
from tests.support.wire_formats import RESPONSES, FormatCase, Upstream, by_format

WINDOW = 4096


@pytest.fixture
def roomy(format_upstream: Upstream, format_proxies: LoopbackProxies) -> LoopbackProxies:
    """Proxies in front of an upstream with room for anything: only the proxies' windows decide."""
    format_upstream.context_window = 1_000_000
    return format_proxies


@by_format()
async def test_off_switch_and_observe_mode_forward_the_clients_bytes(
    wire: FormatCase, format_upstream: Upstream, roomy: LoopbackProxies
) -> None:
    body = wire.conversation(30, tools=False)
    enforcing = await roomy.start(context_windows={wire.model: WINDOW})
    status, headers, _ = await wire.post(enforcing, body)
    assert status == 200 and headers["X-Compaction"] == "compacted"
    assert len(wire.entries_of(wire.forwarded(format_upstream)[-1])) < len(body[wire.entries])
    assert int(headers["X-Compaction-Tokens-After"]) < int(headers["X-Compaction-Tokens-Before"])
    assert headers["X-Compaction-Context-Window"] == str(WINDOW)

    raw = json.dumps(body).encode()
    status, headers, _ = await wire.post(enforcing, raw, **{"X-Compaction": "off"})
    assert status == 200 and headers["X-Compaction"] == "skipped"
    assert wire.forwarded(format_upstream)[-1] == raw

    observing = await roomy.start(mode="observe", context_windows={wire.model: WINDOW})
    # Deliberately odd formatting, and streamed: observe mode must not even re-serialize it.
    odd = json.dumps({**body, "stream": True}, indent=1).encode()
    status, headers, _ = await wire.post(observing, odd)
    assert status == 200
    assert headers["X-Compaction"] == "would-compact"  # what enforce would have done
    assert wire.forwarded(format_upstream)[-1] == odd


@by_format()
async def test_an_unknown_model_is_forwarded_uncompacted(
    wire: FormatCase, format_upstream: Upstream, roomy: LoopbackProxies
) -> None:
    proxy = await roomy.start(context_windows={wire.model: WINDOW})
    raw = json.dumps(wire.conversation(30, model="acme-private-model", tools=False)).encode()
    status, headers, _ = await wire.post(proxy, raw)
    assert status == 200
    assert headers["X-Compaction"] == "unknown-window"
    assert wire.forwarded(format_upstream)[-1] == raw


@by_format()
async def test_a_request_header_sets_the_window(wire: FormatCase, roomy: LoopbackProxies) -> None:
    proxy = await roomy.start(context_windows={wire.model: WINDOW})
    body = wire.conversation(30, model="acme-private-model", tools=False)
    status, headers, answer = await wire.post(proxy, body, **{"X-Context-Window": "3000"})
    assert status == 200
    assert headers["X-Compaction"] == "compacted"
    assert headers["X-Compaction-Context-Window"] == "3000"
    assert int(headers["X-Compaction-Tokens-After"]) <= 0.4 * 3000 < int(headers["X-Compaction-Tokens-Before"])
    assert wire.prompt_tokens(answer) <= 0.4 * 3000


@by_format()
async def test_an_overflow_is_compacted_and_retried_once(
    wire: FormatCase, format_upstream: Upstream, format_proxies: LoopbackProxies
) -> None:
    # The proxy believes the window is 16k; the upstream only has 4k and says so in its error.
    format_upstream.context_window = WINDOW
    proxy = await format_proxies.start(context_windows={wire.model: 16_384})
    body = wire.conversation(14)
    raw = json.dumps(body).encode()
    status, headers, reply = await wire.post(proxy, raw)
    assert status == 200, reply
    assert headers["X-Compaction"] == "compacted-after-overflow"
    learned = int(headers["X-Compaction-Context-Window"])
    assert learned == WINDOW if wire.overflow_states_window else learned < 16_384
    assert int(headers["X-Compaction-Tokens-After"]) <= 0.4 * learned
    rejected, retried = wire.forwarded(format_upstream)  # the rejected original, then one compacted retry
    assert rejected == raw and wire.entries_of(retried) != body[wire.entries]
    # The retry's compaction is counted as one (by strategy and tokens), the request once, as first decided.
    exposed = await proxy.exposition()
    assert "compaction_proxy_tokens_after_count 1.0" in exposed
    assert 'compaction_proxy_overflow_retries_total{result="compacted"} 1.0' in exposed
    assert f'compaction_proxy_outcomes_total{{api="{wire.name}",outcome="compacted"}}' not in exposed
    # The learned window holds for the next request: compacted up front, no second rejection.
    status, headers, _ = await wire.post(proxy, wire.conversation(15))
    assert status == 200
    assert headers["X-Compaction"] == "compacted"
    assert int(headers["X-Compaction-Context-Window"]) < 16_384
    assert headers["X-Compaction-Window-Source"] == "learned"
    assert len(wire.forwarded(format_upstream)) == 3


@by_format()
async def test_a_large_request_is_retried_after_an_overflow_too(
    wire: FormatCase, format_upstream: Upstream, format_proxies: LoopbackProxies
) -> None:
    # Over RELEASE_FROM_BYTES the proxy lets go of the parsed request while the upstream answers: it parses it again.
    format_upstream.context_window = 32_768
    proxy = await format_proxies.start(context_windows={wire.model: 1_000_000})
    body = wire.conversation(200, tools=False)
    assert len(json.dumps(body)) >= RELEASE_FROM_BYTES
    status, headers, answer = await wire.post(proxy, body)
    assert status == 200, answer
    assert headers["X-Compaction"] == "compacted-after-overflow"
    learned = int(headers["X-Compaction-Context-Window"])
    assert learned == 32_768 if wire.overflow_states_window else learned < 1_000_000
    assert wire.prompt_tokens(answer) <= 0.4 * learned <= 32_768


@by_format()
async def test_two_credentials_share_no_state(
    wire: FormatCase, format_upstream: Upstream, roomy: LoopbackProxies
) -> None:
    proxy = await roomy.start(context_windows={wire.model: WINDOW})
    window = {"X-Context-Window": "6000"}
    body = wire.conversation(30, tools=False)
    # Alice's long conversation is compacted, and the proxy remembers the rewrite for it...
    _status, headers, _ = await wire.post(proxy, body, **window)
    assert headers["X-Compaction"] == "compacted"
    alice_sent = wire.entries_of(wire.forwarded(format_upstream)[-1])
    # ...but Bob's next turn of the very same conversation finds none of it: he is compacted afresh...
    _status, headers, _ = await wire.post(proxy, wire.next_turn(body), key="sk-bob", **window)
    assert headers["X-Compaction"] == "compacted"
    # ...while Alice's next turn replays her rewrite, which leaves it under the trigger: the prefix stays as sent.
    _status, headers, _ = await wire.post(proxy, wire.next_turn(body), **window)
    assert headers["X-Compaction"] == "unchanged"
    assert wire.entries_of(wire.forwarded(format_upstream)[-1])[: len(alice_sent)] == alice_sent


@by_format()
async def test_a_window_override_is_not_remembered(
    wire: FormatCase, format_upstream: Upstream, roomy: LoopbackProxies
) -> None:
    proxy = await roomy.start(context_windows={})  # the model's own window, from the shipped table
    body = wire.conversation(30, tools=False)
    _status, headers, _ = await wire.post(proxy, body, **{"X-Context-Window": "6000"})
    assert headers["X-Compaction"] == "compacted"
    # The next turn without the override, under the model's own window, is forwarded whole.
    raw = json.dumps(wire.next_turn(body)).encode()
    _status, headers, _ = await wire.post(proxy, raw)
    assert headers["X-Compaction"] == "unchanged"
    assert wire.forwarded(format_upstream)[-1] == raw


@by_format()
async def test_metrics_count_compactions_by_strategy(wire: FormatCase, roomy: LoopbackProxies) -> None:
    proxy = await roomy.start(context_windows={wire.model: WINDOW})
    await wire.post(proxy, wire.conversation(30, tools=False), **{"X-Context-Window": "3000"})
    exposed = await proxy.exposition()
    assert 'compaction_proxy_compactions_total{strategy="user_message_window"} 1.0' in exposed
    assert f'compaction_proxy_outcomes_total{{api="{wire.name}",outcome="compacted"}} 1.0' in exposed


# ---- the Responses API only ---------------------------------------------------------------------------------------

TOOLS: list[Any] = [{"type": "function", "name": "read_file", "parameters": {"type": "object", "properties": {}}}]


@pytest.fixture
async def responses_proxies(openai_upstream: OpenAIUpstream) -> AsyncIterator[LoopbackProxies]:
    """Proxies in front of the OpenAI fake; both give the Responses case's model a 32k window."""
    openai_upstream.context_window = 32_000
    started = LoopbackProxies(upstream=openai_upstream.base_url, context_windows={RESPONSES.model: 32_000})
    yield started
    await started.close()


async def post_responses(url: str, body: dict[str, Any], **headers: str) -> tuple[int, dict[str, str], Any]:
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
    openai_upstream: OpenAIUpstream, responses_proxies: LoopbackProxies
) -> None:
    story: list[dict[str, Any]] = [{"role": "user", "content": "story " * 1500}]
    management = [{"type": "compaction", "compact_threshold": 500}]
    _status, _headers, compacted = await post_responses(
        openai_upstream.base_url + "/v1",
        {"model": RESPONSES.model, "input": story, "store": False, "context_management": management},
    )
    assert compacted["output"][0]["type"] == "compaction"
    proxy = await responses_proxies.start()
    follow_up = {"role": "user", "content": "and then?"}
    body = {"model": RESPONSES.model, "input": [*story, *carried(compacted), follow_up], "store": False}
    # A compaction item shows a client that compacts itself, deferred to until it would not fit: not here.
    ignored = {"X-Context-Window": "2000", "X-Compaction-Client": "ignore"}
    status, headers, answer = await post_responses(proxy.url, body, **ignored)
    assert status == 200, answer
    assert headers["X-Compaction"] == "compacted"
    assert headers["X-Compaction-Strategies"] == "provider_compaction"
    assert openai_upstream.responses_requests[-1]["input"] == [*carried(compacted), follow_up]


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
    openai_upstream: OpenAIUpstream, responses_proxies: LoopbackProxies, mode: str, header: str, added: dict[str, Any]
) -> None:
    proxy = await responses_proxies.start(provider_state=mode, context_windows={RESPONSES.model: 2000})
    status, headers, first = await post_responses(proxy.url, {"model": RESPONSES.model, "input": "hello"})
    assert status == 200 and headers["X-Compaction"] == "unchanged"
    small = {"model": RESPONSES.model, "input": "again", "previous_response_id": first["id"]}
    status, headers, second = await post_responses(proxy.url, small)
    assert (status, headers["X-Compaction"]) == (200, "provider-state")
    assert openai_upstream.responses_requests[-1] == small
    over = {"model": RESPONSES.model, "input": "word " * 1500, "previous_response_id": second["id"]}
    status, headers, _ = await post_responses(proxy.url, over)
    assert (status, headers["X-Compaction"]) == (200, header)
    assert openai_upstream.responses_requests[-1] == {**over, **added}
    managed = {**over, "truncation": "auto"}
    status, headers, _ = await post_responses(proxy.url, managed)
    assert headers["X-Compaction"] == "provider-state"
    assert openai_upstream.responses_requests[-1] == managed, "the client's own context management is left alone"


async def test_an_sdk_agent_with_reasoning_streams_through_a_compacting_proxy(
    openai_upstream: OpenAIUpstream, responses_proxies: LoopbackProxies
) -> None:
    openai_upstream.responses_responder = responses_tool_loop_responder("read_file", steps=6)
    # Without offloading (its pointers, with their digests, fill a 3k window): the repeated lines are written once.
    proxy = await responses_proxies.start(context_windows={RESPONSES.model: 3000}, offload=False)
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0) as client:
        items: list[dict[str, Any]] = [{"role": "user", "content": "Review the module."}]
        # Until the model answers (at most 10 turns): how many it takes depends on what the chain keeps at 3,000 tokens.
        for _turn in range(10):
            stream = await client.responses.create(
                model=RESPONSES.model,
                input=items,
                tools=TOOLS,
                store=False,
                include=["reasoning.encrypted_content"],
                stream=True,
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
    forwarded = json.dumps(openai_upstream.responses_requests[-1]["input"])
    assert "line\\n[the previous line repeats 299 more times]" in forwarded, "the run was compacted, losslessly"


async def test_an_overflow_inside_the_stream_is_retried_before_the_client_sees_it(
    openai_upstream: OpenAIUpstream, responses_proxies: LoopbackProxies
) -> None:
    openai_upstream.context_window = 3000
    openai_upstream.responses_overflow_in_stream = True
    proxy = await responses_proxies.start()  # believes the model has 32,000 tokens
    items = tool_history(steps=8, output_words=500)
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0) as client:
        raw = await client.responses.with_raw_response.create(
            model=RESPONSES.model,
            input=items,  # type: ignore[arg-type]
            tools=TOOLS,
            stream=True,
        )
        events = [event.type async for event in raw.parse()]
    assert raw.headers["X-Compaction"] == "compacted-after-overflow"
    assert "error" not in events and events[-1] == "response.completed"
    assert events[:2] == ["response.created", "response.in_progress"]
    assert len(openai_upstream.responses_requests) == 2
