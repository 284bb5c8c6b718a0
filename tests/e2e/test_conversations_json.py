"""The ledger's JSON through the real proxy: recent conversations and each one's records, equal to the upstream's
own usage, named by hashes only, behind the dashboard switch and the proxy keys."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from proxy.pipeline.cache_misses import CAUSES
from proxy.simulator.anthropic_upstream import AnthropicUpstream, tool_loop_responder
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.support.fake_clock import FakeClock
from tests.support.proxies import LoopbackProxies, RunningProxy
from tests.support.wire_formats.case import PARAGRAPH

MODEL = "gpt-4o-mini"
CLAUDE = "claude-sonnet-4-5"
KEY = "dashboard-key-0123456789"
SECRET_WORDS = "a question nobody may read back"
INSTRUCTIONS = "You answer in one line. " + PARAGRAPH * 80
EPHEMERAL = {"type": "ephemeral"}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def proxies() -> AsyncIterator[LoopbackProxies]:
    started = LoopbackProxies()
    yield started
    await started.close()


async def get(proxy: RunningProxy, path: str, **headers: str) -> tuple[int, Any]:
    url = f"http://127.0.0.1:{proxy.server.port}{path}"
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as response:
        return response.status, await response.json(content_type=None)


async def the_only_conversation(proxy: RunningProxy) -> tuple[dict[str, Any], dict[str, Any]]:
    """The one conversation the proxy lists, and its page's JSON."""
    _, listing = await get(proxy, "/dashboard/conversations.json")
    (conversation,) = listing["conversations"]
    _, answer = await get(proxy, f"/dashboard/conversations/{conversation['id']}.json")
    return conversation, answer


def records_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = answer["records"]
    for record in records:
        assert set(record["misses"]) == set(CAUSES)
        assert sum(record["misses"].values()) == record["prompt_tokens"] - record["cached_tokens"]
    return records


async def chat_turns(client: AsyncOpenAI, opening: str, turns: int, clock: FakeClock) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": opening}]
    for _turn in range(turns):
        clock.advance(10)
        completion = await client.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
        messages += [
            {"role": "assistant", "content": completion.choices[0].message.content},
            {"role": "user", "content": "And then? " + PARAGRAPH * 4},
        ]


async def test_the_recent_conversations_and_their_records_equal_the_upstreams_usage(
    proxies: LoopbackProxies, clock: FakeClock
) -> None:
    async with OpenAIUpstream(context_window=8192) as upstream:
        upstream.prompt_cache.clock = clock
        proxy = await proxies.start(
            upstream=upstream.base_url, context_windows={MODEL: 8192}, dashboard=True, clock=clock
        )
        async with AsyncOpenAI(base_url=proxy.url, api_key="sk-json") as client:
            await chat_turns(client, SECRET_WORDS, 4, clock)
            await chat_turns(client, "Another task entirely.", 1, clock)
        status, listing = await get(proxy, "/dashboard/conversations.json")
    assert status == 200
    latest, earlier = listing["conversations"]
    assert (latest["requests"], earlier["requests"]) == (1, 4)
    assert latest["last_seen"] > earlier["last_seen"]
    assert earlier["api"] == "chat_completions" and earlier["model"] == MODEL and len(earlier["tenant"]) == 12
    status, answer = await get(proxy, f"/dashboard/conversations/{earlier['id']}.json")
    assert status == 200
    records = records_of(answer)
    usages = upstream.usages[:4]
    assert [record["prompt_tokens"] for record in records] == [usage["prompt_tokens"] for usage in usages]
    assert [record["cached_tokens"] for record in records] == [
        usage["prompt_tokens_details"]["cached_tokens"] for usage in usages
    ]
    assert [record["output_tokens"] for record in records] == [usage["completion_tokens"] for usage in usages]
    assert answer["totals"]["prompt_tokens"] == sum(usage["prompt_tokens"] for usage in usages)
    assert records[0]["misses"]["first"] == records[0]["prompt_tokens"]
    assert [record["client_reused_tokens"] for record in records[1:]] == [
        record["client_tokens"] for record in records[:-1]
    ]
    assert answer["dropped"] == 0 and listing["limits"] == {"conversations": 128, "requests": 256}
    assert SECRET_WORDS not in str(listing) + str(answer) and "sk-json" not in str(listing) + str(answer)
    assert_bills(proxy, listing, answer, upstream.usages)


BILL_KINDS = {"uncached": "uncached_input", "cached": "cached_input", "cache_write": "cache_write_input"}


def assert_bills(proxy: RunningProxy, listing: dict[str, Any], answer: dict[str, Any], usages: list[Any]) -> None:
    """The bills: a conversation's in its JSON and in the list, their total, and the metrics' tokens each way."""
    bills = [conversation["bill"] for conversation in listing["conversations"]]
    mine = next(c["bill"] for c in listing["conversations"] if c["id"] == answer["id"])
    assert answer["bill"] == mine and mine["proxy"]["requests"] == answer["requests"]
    total = listing["total"]
    assert total["conversations"] == len(bills) and not total["stopped"]
    assert total["proxy"]["requests"] == len(usages) == sum(bill["proxy"]["requests"] for bill in bills)
    prompt = sum(usage["prompt_tokens"] for usage in usages)
    assert total["proxy"]["uncached_input"] + total["proxy"]["cached_input"] == prompt
    assert total["proxy"]["output"] == sum(usage["completion_tokens"] for usage in usages)
    for way in ("proxy", "direct"):
        counted = {
            kind: proxy.metric("compaction_proxy_bill_tokens_total", api="chat_completions", way=way, kind=kind)
            for kind in (*BILL_KINDS, "output")
        }
        assert counted == {kind: total[way][BILL_KINDS.get(kind, kind)] for kind in counted}, way


async def test_a_responses_conversation_records_the_upstreams_usage(proxies: LoopbackProxies, clock: FakeClock) -> None:
    async with OpenAIUpstream(context_window=8192) as upstream:
        upstream.prompt_cache.clock = clock
        proxy = await proxies.start(
            upstream=upstream.base_url, context_windows={MODEL: 8192}, dashboard=True, clock=clock
        )
        items: list[dict[str, Any]] = [{"role": "user", "content": "What failed first?"}]
        async with AsyncOpenAI(base_url=proxy.url, api_key="sk-responses") as client:
            for _turn in range(3):
                clock.advance(10)
                response = await client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=items)  # type: ignore[arg-type]
                items += [
                    {"role": "assistant", "content": response.output_text},
                    {"role": "user", "content": "And then? " + PARAGRAPH * 4},
                ]
        conversation, answer = await the_only_conversation(proxy)
    records = records_of(answer)
    assert conversation["api"] == "responses"
    usages = upstream.responses_usages
    assert [record["prompt_tokens"] for record in records] == [usage["input_tokens"] for usage in usages]
    assert [record["cached_tokens"] for record in records] == [
        usage["input_tokens_details"]["cached_tokens"] for usage in usages
    ]
    assert records[2]["cached_tokens"] > 0 and records[0]["misses"]["first"] == records[0]["prompt_tokens"]


async def test_a_streamed_messages_conversation_records_cache_reads_and_writes(
    proxies: LoopbackProxies, clock: FakeClock
) -> None:
    async with AnthropicUpstream(context_window=32_000, responder=tool_loop_responder(tool=None)) as upstream:
        upstream.cache.clock = clock
        proxy = await proxies.start(upstream=upstream.base_url, dashboard=True, clock=clock)
        system = [{"type": "text", "text": INSTRUCTIONS, "cache_control": EPHEMERAL}]
        messages: list[dict[str, Any]] = [{"role": "user", "content": "What failed first?"}]
        client = AsyncAnthropic(base_url=f"http://127.0.0.1:{proxy.server.port}", api_key="sk-ant-test")
        async with client:
            for _turn in range(3):
                clock.advance(10)
                async with client.messages.stream(
                    model=CLAUDE,
                    max_tokens=200,
                    system=system,
                    messages=messages,  # type: ignore[arg-type]
                ) as stream:
                    reply = await stream.get_final_message()
                messages += [
                    {"role": "assistant", "content": reply.content[-1].text},  # type: ignore[union-attr]
                    {"role": "user", "content": "And then? " + PARAGRAPH * 4},
                ]
        conversation, answer = await the_only_conversation(proxy)
    records = records_of(answer)
    assert conversation["api"] == "messages"
    usages = upstream.usages
    assert [record["cache_write_tokens"] for record in records] == [
        usage["cache_creation_input_tokens"] for usage in usages
    ]
    assert [record["cached_tokens"] for record in records] == [usage["cache_read_input_tokens"] for usage in usages]
    assert [record["prompt_tokens"] for record in records] == [
        usage["input_tokens"] + usage["cache_creation_input_tokens"] + usage["cache_read_input_tokens"]
        for usage in usages
    ]
    assert records[0]["cache_write_tokens"] > 0 and records[1]["cached_tokens"] > 0


async def test_the_json_sits_behind_the_dashboard_switch_and_the_proxy_keys(proxies: LoopbackProxies) -> None:
    async with OpenAIUpstream() as upstream:
        off = await proxies.start(upstream=upstream.base_url)
        keyed = await proxies.start(upstream=upstream.base_url, dashboard=True, proxy_keys=[KEY])
        for path in ("/dashboard/conversations.json", "/dashboard/conversations/0123abcd.json"):
            status, body = await get(off, path)
            assert (status, body["error"]["code"]) == (404, "dashboard_off"), path
            assert (await get(keyed, path))[0] == 401, path
        basic = "Basic " + base64.b64encode(f"me:{KEY}".encode()).decode()
        status, listing = await get(keyed, "/dashboard/conversations.json", Authorization=basic)
        assert (status, listing["conversations"], listing["limits"]) == (
            200,
            [],
            {"conversations": 128, "requests": 256},
        )
        assert listing["total"]["conversations"] == listing["total"]["proxy"]["requests"] == 0
        status, body = await get(keyed, "/dashboard/conversations/0123abcd.json", **{"X-Proxy-Key": KEY})
        assert (status, body["error"]["code"]) == (404, "conversation_not_found")
        assert upstream.requests == []  # answered by the proxy, never forwarded


async def test_a_client_that_moves_its_cache_mark_every_turn_stays_one_conversation_without_client_misses(
    proxies: LoopbackProxies, clock: FakeClock
) -> None:
    async with AnthropicUpstream(context_window=32_000, responder=tool_loop_responder(tool=None)) as upstream:
        upstream.cache.clock = clock
        proxy = await proxies.start(upstream=upstream.base_url, dashboard=True, clock=clock)
        said: list[str] = []
        messages: list[dict[str, Any]] = [{"role": "user", "content": "What failed first? " + PARAGRAPH * 70}]
        client = AsyncAnthropic(base_url=f"http://127.0.0.1:{proxy.server.port}", api_key="sk-ant-test")
        async with client:
            for _turn in range(4):
                clock.advance(10)
                # As Claude Code does: only the newest message carries the breakpoint, as a text block.
                newest = {"type": "text", "text": messages[-1]["content"], "cache_control": EPHEMERAL}
                marked = [*messages[:-1], {"role": "user", "content": [newest]}]
                raw = await client.messages.with_raw_response.create(
                    model=CLAUDE,
                    max_tokens=200,
                    system="You answer in one line.",
                    messages=marked,  # type: ignore[arg-type]
                )
                said.append(raw.headers["x-compaction-cache-misses"])
                messages += [
                    {"role": "assistant", "content": (await raw.parse()).content[-1].text},  # type: ignore[union-attr]
                    {"role": "user", "content": "And then? " + PARAGRAPH * 4},
                ]
        _, listing = await get(proxy, "/dashboard/conversations.json")
    (conversation,) = listing["conversations"]
    assert said == ["first", "new", "new", "new"]
    assert conversation["requests"] == 4 and conversation["totals"]["misses"]["client"] == 0
    assert conversation["totals"]["cached_tokens"] > 0
