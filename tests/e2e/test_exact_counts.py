"""Exact counts against loopback servers that count like llama.cpp and vLLM, with a tokenizer that is not tiktoken.

The proxy must estimate the first request of a conversation exactly where the server can count it, let the trigger
act on that count, ask a re-sent conversation only about what is new, and fail open: a server without the endpoints,
a slow one (a request waits at most `exact_count_timeout`) and a lying one change nothing but metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from pydantic import ValidationError

from proxy.config import Settings
from proxy.config.compaction import DEFAULT_COUNT_PROBES
from proxy.config.loading import load_settings
from proxy.discovery.service import probes_for
from proxy.engine import counter_for_model
from tests.reliability.conftest import wait_for
from tests.support.counting_upstream import CountingUpstream
from tests.support.proxies import LoopbackProxies, RunningProxy

MODEL = "acme-local-model"
COUNTING = {"count_probes": list(DEFAULT_COUNT_PROBES), "exact_count_timeout": 5.0, "context_windows": {MODEL: 8192}}
"""A generous budget where the test is about what is counted, not how long it may take."""
WORDS = "the sensor array reported calibrated temperature readings across every northern station today"


def conversation(turns: int) -> list[dict[str, Any]]:
    """A conversation without a system prompt (the template adds its own) of `turns` user and assistant turns."""
    messages: list[dict[str, Any]] = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Turn {turn}: {WORDS} {WORDS}."})
        messages.append({"role": "assistant", "content": f"Noted turn {turn}: {WORDS}."})
    return [*messages, {"role": "user", "content": "Summarize the readings."}]


@pytest.fixture
async def proxies() -> AsyncIterator[LoopbackProxies]:
    running = LoopbackProxies()
    yield running
    await running.close()


async def chat(proxy: RunningProxy, messages: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, Any]]:
    """One chat completion through the proxy: its response headers and body."""
    body = {"model": MODEL, "messages": messages}
    async with (
        aiohttp.ClientSession() as http,
        http.post(proxy.url + "/chat/completions", json=body, headers={"Authorization": "Bearer sk-alice"}) as answer,
    ):
        assert answer.status == 200, await answer.text()
        return dict(answer.headers), await answer.json()


async def metrics(proxy: RunningProxy) -> str:
    async with aiohttp.ClientSession() as http, http.get(proxy.url.removesuffix("/v1") + "/metrics") as answer:
        return await answer.text()


async def settled(proxy: RunningProxy) -> None:
    """Wait until no count is in flight."""
    await wait_for(lambda: not proxy.service.exact.counts.running())


@pytest.mark.parametrize("kind", ["llama.cpp", "vllm"])
async def test_the_first_request_is_estimated_exactly(kind: str, proxies: LoopbackProxies) -> None:
    async with CountingUpstream(kind) as upstream:
        proxy = await proxies.start(upstream=upstream.url, **COUNTING)
        headers, body = await chat(proxy, conversation(3))

    assert headers["X-Compaction-Count"] == "exact"
    assert int(headers["X-Compaction-Tokens-Before"]) == body["usage"]["prompt_tokens"]
    assert "X-Compaction-Tokens-Before-Bound" not in headers
    # The count carries the caller's own credentials, like the request it counts.
    assert {seen.headers.get("Authorization") for seen in upstream.counted()} == {"Bearer sk-alice"}
    # tiktoken alone would have been far off this tokenizer.
    local = counter_for_model(MODEL).messages_tokens(conversation(3))
    assert local < 0.8 * body["usage"]["prompt_tokens"]
    exposed = await metrics(proxy)
    assert 'compaction_proxy_exact_counts_total{result="counted"} 1.0' in exposed
    assert "compaction_proxy_local_count_error_ratio_count 1.0" in exposed


@pytest.mark.parametrize("probes", [list(DEFAULT_COUNT_PROBES), []])
async def test_the_trigger_acts_on_the_exact_count(probes: list[str], proxies: LoopbackProxies) -> None:
    """Under the trigger by tiktoken's count, over it by the server's: compacted at once only with exact counts."""
    messages = conversation(6)
    async with CountingUpstream() as upstream:
        proxy = await proxies.start(upstream=upstream.url, **{**COUNTING, "count_probes": probes})
        exact = (await chat(proxy, messages))[1]["usage"]["prompt_tokens"]
        local = counter_for_model(MODEL).messages_tokens(messages)
        window = int((local + exact) / 2 / 0.7)
        # Another proxy, so nothing is learned from the first answer: its first request decides on what it counts.
        windows = {"context_windows": {MODEL: window}}
        trigger = await proxies.start(upstream=upstream.url, **{**COUNTING, "count_probes": probes, **windows})
        headers, _ = await chat(trigger, [*messages, {"role": "user", "content": "And now?"}])

    assert headers["X-Compaction"] == ("compacted" if probes else "unchanged")


async def test_a_resent_conversation_asks_only_about_its_new_text(proxies: LoopbackProxies) -> None:
    """A small tail after the reported prefix asks nothing; a large one asks, and only its text is tokenized."""
    messages = conversation(3)
    report = f"New readings: {WORDS} {WORDS} {WORDS} {WORDS} {WORDS}."
    async with CountingUpstream() as upstream:
        proxy = await proxies.start(upstream=upstream.url, **COUNTING)
        _, first = await chat(proxy, messages)
        reply = first["choices"][0]["message"]
        small = [*messages, reply, {"role": "user", "content": "And now?"}]
        asked = len(upstream.seen)
        await chat(proxy, small)
        assert [seen.path for seen in upstream.seen[asked:]] == ["/v1/chat/completions"]

        large = [*messages, reply, {"role": "user", "content": report}]
        asked = len(upstream.seen)
        headers, second = await chat(proxy, large)
        tokenized = [seen.json["content"] for seen in upstream.seen[asked:] if seen.path == "/tokenize"]

    assert headers["X-Compaction-Count"] == "exact"
    assert int(headers["X-Compaction-Tokens-Before"]) == second["usage"]["prompt_tokens"]
    assert tokenized == [f"<|im_start|>assistant\nOk.<|im_end|>\n<|im_start|>user\n{report}<|im_end|>\n"]
    exposed = await metrics(proxy)
    assert 'compaction_proxy_exact_counts_total{result="reported"} 1.0' in exposed
    assert 'compaction_proxy_exact_counts_total{result="counted"} 2.0' in exposed


async def test_a_server_without_the_endpoints_is_asked_once(proxies: LoopbackProxies) -> None:
    async with CountingUpstream("none") as upstream:
        proxy = await proxies.start(upstream=upstream.url, **COUNTING)
        for turn in range(4):
            headers, _ = await chat(proxy, conversation(turn + 1))
            assert "X-Compaction-Count" not in headers

    assert [seen.path for seen in upstream.counted()] == ["/apply-template", "/tokenize"]
    # The first request asked and was not answered; with nothing left to ask, the next three (under the trigger in
    # bytes) were sized by their bytes and counted nothing.
    exposed = await metrics(proxy)
    assert 'compaction_proxy_exact_counts_total{result="failed"} 1.0' in exposed
    assert 'compaction_proxy_outcomes_total{api="chat_completions",outcome="unchanged"} 4.0' in exposed


async def test_a_slow_server_delays_a_request_by_the_budget_at_most(proxies: LoopbackProxies) -> None:
    hold = asyncio.Event()
    async with CountingUpstream(hold=hold) as upstream:
        budget = 0.5
        proxy = await proxies.start(upstream=upstream.url, **{**COUNTING, "exact_count_timeout": budget})
        started = time.monotonic()
        headers, _ = await chat(proxy, conversation(2))
        waited = time.monotonic() - started
        hold.set()
        await settled(proxy)
        asked = len(upstream.counted())
        await chat(proxy, conversation(2))

    assert budget <= waited < budget + 1.0, waited
    assert "X-Compaction-Count" not in headers
    # The late answer is kept: the conversation sent again asks nothing more.
    assert len(upstream.counted()) == asked
    exposed = await metrics(proxy)
    assert 'compaction_proxy_exact_counts_total{result="late"} 1.0' in exposed
    assert 'compaction_proxy_exact_counts_total{result="cached"} 1.0' in exposed


@pytest.mark.parametrize(("kind", "lie"), [("vllm", 10**9), ("vllm", 1), ("llama.cpp", 1)])
async def test_a_lying_count_is_ignored(kind: str, lie: int, proxies: LoopbackProxies) -> None:
    async with CountingUpstream(kind, lie=lie) as upstream:
        proxy = await proxies.start(upstream=upstream.url, **COUNTING)
        headers, body = await chat(proxy, conversation(20))

    assert "X-Compaction-Count" not in headers
    estimate = int(headers["X-Compaction-Tokens-Before"])
    assert estimate < 2 * body["usage"]["prompt_tokens"]
    assert 'compaction_proxy_exact_counts_total{result="implausible"} 1.0' in await metrics(proxy)


def test_count_probes_are_off_against_openai_and_the_responses_counter_is_opt_in() -> None:
    assert probes_for(Settings(), "count_probes") == []
    assert probes_for(Settings(upstream="http://127.0.0.1:8000"), "count_probes") == list(DEFAULT_COUNT_PROBES)
    assert "responses_input_tokens" not in DEFAULT_COUNT_PROBES
    chosen = Settings(count_probes=["responses_input_tokens"])
    assert probes_for(chosen, "count_probes") == ["responses_input_tokens"]
    with pytest.raises(ValidationError, match="unknown count probes"):
        Settings(count_probes=["tiktoken"])
    environ = {"COMPACTION_PROXY_COUNT_PROBES": "vllm_tokenize, responses_input_tokens"}
    assert load_settings(environ=environ).count_probes == ["vllm_tokenize", "responses_input_tokens"]
