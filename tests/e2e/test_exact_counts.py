"""Exact counts: the first request of every format decided on what its upstream counts; then chat completions against
loopback servers that count like llama.cpp and vLLM (with a tokenizer that is not tiktoken), and OpenAI's Responses
input-token counter against a loopback server answering like `/v1/responses/input_tokens`.

The proxy must estimate the first request of a conversation exactly where the server can count it, let the trigger
act on that count, ask a re-sent conversation only about what is new, and fail open: a server without the endpoints,
a slow one (a request waits at most `exact_count_timeout`) and a lying one change nothing but metrics. The Responses
counter is opt-in only; asks with the caller's key and only the input fields; remembers each answer; waits at most
`exact_count_timeout`; and ignores a missing, refusing or nonsensical answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from pydantic import ValidationError

from proxy.config import Settings
from proxy.config.compaction import DEFAULT_COUNT_PROBES
from proxy.config.loading import load_settings
from proxy.discovery.budgeted import Outcome
from proxy.discovery.input_tokens import ResponsesInputTokens
from proxy.discovery.service import probes_for
from proxy.engine import counter_for_model
from proxy.pipeline.exact_counts import COUNT_HEADER
from proxy.simulator.anthropic_upstream import AnthropicUpstream, tool_loop_responder
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.reliability.conftest import wait_for
from tests.support.counting_upstream import CountingUpstream
from tests.support.proxies import LoopbackProxies, RunningProxy
from tests.support.wire_formats import CHAT_COMPLETIONS, RESPONSES, FormatCase, by_format

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


async def settled(proxy: RunningProxy) -> None:
    """Wait until no count is in flight."""
    await wait_for(lambda: not proxy.service.exact.counts.running())


@asynccontextmanager
async def counting_upstream(wire: FormatCase) -> AsyncIterator[tuple[str, list[str]]]:
    """An upstream of `wire`'s format that counts prompts as it bills them, and the count probes that ask it."""
    if wire is CHAT_COMPLETIONS:
        async with CountingUpstream("vllm") as vllm:
            yield vllm.url, list(DEFAULT_COUNT_PROBES)
    elif wire is RESPONSES:
        async with OpenAIUpstream() as openai_fake:
            yield openai_fake.base_url, ["responses_input_tokens"]
    else:
        async with AnthropicUpstream(responder=tool_loop_responder(tool=None)) as anthropic_fake:
            yield anthropic_fake.base_url, ["anthropic_count_tokens"]


@by_format()
async def test_the_first_request_is_decided_on_the_upstreams_count(wire: FormatCase, proxies: LoopbackProxies) -> None:
    body = wire.conversation(3, paragraphs=40)
    async with counting_upstream(wire) as (url, probes):
        windows = {wire.model: 400_000}
        proxy = await proxies.start(upstream=url, **{**COUNTING, "count_probes": probes, "context_windows": windows})
        status, headers, answer = await wire.post(proxy, body)

    assert status == 200, answer
    assert headers[COUNT_HEADER] == "exact"
    assert int(headers["X-Compaction-Tokens-Before"]) == wire.prompt_tokens(answer)
    assert "X-Compaction-Tokens-Before-Bound" not in headers
    assert 'compaction_proxy_exact_counts_total{result="counted"} 1.0' in await proxy.exposition()


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
    exposed = await proxy.exposition()
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
    exposed = await proxy.exposition()
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
    exposed = await proxy.exposition()
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
    exposed = await proxy.exposition()
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
    assert 'compaction_proxy_exact_counts_total{result="implausible"} 1.0' in await proxy.exposition()


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


# ---- OpenAI's Responses input-token counter ----------------------------------------------------------------------

INPUT_BODY = {
    "model": "gpt-5",
    "instructions": "Be brief.",
    "input": [{"role": "user", "content": "How many tokens is this?"}],
    "stream": True,
    "store": False,
}
INPUT_HEADERS = {"authorization": "Bearer sk-alice", "x-conversation-id": "c1"}

Answer = Callable[[web.Request], Awaitable[web.StreamResponse]]


class InputTokensServer:
    """Answers `POST /v1/responses/input_tokens` with `answer`; records what it received."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.seen: list[tuple[dict[str, str], Any]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((dict(request.headers), await request.json()))
        return await self.answer(request)


def counted(tokens: Any, kind: str = "response.input_tokens") -> Answer:
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": kind, "input_tokens": tokens})

    return answer


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Answer], Awaitable[tuple[InputTokensServer, str]]]]:
    servers: list[TestServer] = []

    async def start(answer: Answer) -> tuple[InputTokensServer, str]:
        like = InputTokensServer(answer)
        app = web.Application()
        app.router.add_post("/v1/responses/input_tokens", like.handle)
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        servers.append(server)
        return like, f"http://127.0.0.1:{server.port}"

    yield start
    for server in servers:
        await server.close()


def counter(url: str, **settings: Any) -> ResponsesInputTokens:
    return ResponsesInputTokens(Settings(upstream=url, **{"count_probes": ["responses_input_tokens"], **settings}))


async def test_counts_with_the_callers_key_and_only_the_input_fields_once(serve: Any) -> None:
    server, url = await serve(counted(17))
    responses = counter(url, exact_count_timeout=5.0)
    try:
        assert await responses.count(INPUT_BODY, b"alice", INPUT_HEADERS) == (17, Outcome.COUNTED)
        assert await responses.count(INPUT_BODY, b"alice", INPUT_HEADERS) == (17, Outcome.CACHED)
    finally:
        await responses.aclose()
    [(headers, body)] = server.seen
    assert headers["Authorization"] == "Bearer sk-alice"
    assert "x-conversation-id" not in {name.lower() for name in headers}
    assert body == {key: INPUT_BODY[key] for key in ("model", "instructions", "input")}


async def test_off_unless_asked_for(serve: Any) -> None:
    server, url = await serve(counted(17))
    responses = ResponsesInputTokens(Settings(upstream=url))
    try:
        assert await responses.count(INPUT_BODY, b"alice", INPUT_HEADERS) == (None, Outcome.FAILED)
    finally:
        await responses.aclose()
    assert server.seen == []


@pytest.mark.parametrize("answer", [counted("17"), counted(-1), counted(True), counted(17, kind="list")])
async def test_nonsense_is_ignored(answer: Answer, serve: Any) -> None:
    _, url = await serve(answer)
    responses = counter(url, exact_count_timeout=5.0)
    try:
        assert await responses.count(INPUT_BODY, b"alice", INPUT_HEADERS) == (None, Outcome.FAILED)
    finally:
        await responses.aclose()


async def test_a_refusal_or_a_missing_endpoint_is_ignored(serve: Any) -> None:
    async def refuse(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"message": "Incorrect API key"}}, status=401)

    _, url = await serve(refuse)
    for upstream in (url, url + "/elsewhere"):
        responses = counter(upstream, exact_count_timeout=5.0)
        try:
            assert await responses.count(INPUT_BODY, b"alice", INPUT_HEADERS) == (None, Outcome.FAILED)
        finally:
            await responses.aclose()


async def test_a_slow_count_waits_the_budget_at_most_and_serves_the_next_request(serve: Any) -> None:
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.json_response({"object": "response.input_tokens", "input_tokens": 23})

    server, url = await serve(slow)
    budget = 0.3
    responses = counter(url, exact_count_timeout=budget)
    try:
        started = time.monotonic()
        assert await responses.count(INPUT_BODY, b"alice", INPUT_HEADERS) == (None, Outcome.LATE)
        assert budget <= time.monotonic() - started < budget + 1.0
        release.set()
        await wait_for(lambda: not responses.counts.running())
        assert await responses.count(INPUT_BODY, b"alice", INPUT_HEADERS) == (23, Outcome.CACHED)
        assert await responses.count(INPUT_BODY, b"bob", INPUT_HEADERS) == (23, Outcome.COUNTED)
    finally:
        await responses.aclose()
    assert len(server.seen) == 2
