"""OpenAI's Responses input-token counter against a loopback server answering like `/v1/responses/input_tokens`.

Opt-in only; asks with the caller's key and only the input fields; remembers each answer; waits at most
`exact_count_timeout`; and ignores a missing, refusing or nonsensical answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.config import Settings
from proxy.discovery.budgeted import Outcome
from proxy.discovery.input_tokens import ResponsesInputTokens
from proxy.pipeline.exact_counts import COUNT_HEADER
from tests.reliability.conftest import wait_for
from tests.support.proxies import LoopbackProxies

BODY = {
    "model": "gpt-5",
    "instructions": "Be brief.",
    "input": [{"role": "user", "content": "How many tokens is this?"}],
    "stream": True,
    "store": False,
}
HEADERS = {"authorization": "Bearer sk-alice", "x-conversation-id": "c1"}

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
        assert await responses.count(BODY, b"alice", HEADERS) == (17, Outcome.COUNTED)
        assert await responses.count(BODY, b"alice", HEADERS) == (17, Outcome.CACHED)
    finally:
        await responses.aclose()
    [(headers, body)] = server.seen
    assert headers["Authorization"] == "Bearer sk-alice"
    assert "x-conversation-id" not in {name.lower() for name in headers}
    assert body == {key: BODY[key] for key in ("model", "instructions", "input")}


async def test_off_unless_asked_for(serve: Any) -> None:
    server, url = await serve(counted(17))
    responses = ResponsesInputTokens(Settings(upstream=url))
    try:
        assert await responses.count(BODY, b"alice", HEADERS) == (None, Outcome.FAILED)
    finally:
        await responses.aclose()
    assert server.seen == []


@pytest.mark.parametrize("answer", [counted("17"), counted(-1), counted(True), counted(17, kind="list")])
async def test_nonsense_is_ignored(answer: Answer, serve: Any) -> None:
    _, url = await serve(answer)
    responses = counter(url, exact_count_timeout=5.0)
    try:
        assert await responses.count(BODY, b"alice", HEADERS) == (None, Outcome.FAILED)
    finally:
        await responses.aclose()


async def test_a_refusal_or_a_missing_endpoint_is_ignored(serve: Any) -> None:
    async def refuse(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"message": "Incorrect API key"}}, status=401)

    _, url = await serve(refuse)
    for upstream in (url, url + "/elsewhere"):
        responses = counter(upstream, exact_count_timeout=5.0)
        try:
            assert await responses.count(BODY, b"alice", HEADERS) == (None, Outcome.FAILED)
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
        assert await responses.count(BODY, b"alice", HEADERS) == (None, Outcome.LATE)
        assert budget <= time.monotonic() - started < budget + 1.0
        release.set()
        await wait_for(lambda: not responses.counts.running())
        assert await responses.count(BODY, b"alice", HEADERS) == (23, Outcome.CACHED)
        assert await responses.count(BODY, b"bob", HEADERS) == (23, Outcome.COUNTED)
    finally:
        await responses.aclose()
    assert len(server.seen) == 2


async def test_the_proxy_decides_a_responses_request_on_openais_count() -> None:
    body = {"model": "gpt-5", "input": [{"role": "user", "content": "word " * 5000}], "store": False}

    async def respond(request: web.Request) -> web.StreamResponse:
        usage = {"input_tokens": 5100, "output_tokens": 1, "total_tokens": 5101}
        return web.json_response({"id": "resp_1", "object": "response", "output": [], "usage": usage})

    app = web.Application()
    app.router.add_post("/v1/responses/input_tokens", counted(5100))
    app.router.add_post("/v1/responses", respond)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    proxies = LoopbackProxies(upstream=f"http://127.0.0.1:{server.port}", context_windows={"gpt-5": 400_000})
    try:
        proxy = await proxies.start(count_probes=["responses_input_tokens"], exact_count_timeout=5.0)
        async with aiohttp.ClientSession() as session, session.post(proxy.url + "/responses", json=body) as answer:
            assert answer.status == 200
            assert answer.headers["X-Compaction-Tokens-Before"] == "5100"
            assert answer.headers[COUNT_HEADER] == "exact"
    finally:
        await proxies.close()
        await server.close()
