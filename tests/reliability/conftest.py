"""Fixtures for the reliability tests: the fake upstream and the real proxy (real compaction service) on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict

from proxy.config import Settings
from proxy.pipeline.exchange import Compaction
from proxy.pipeline.service import CompactionPipeline
from proxy.server import create_app
from proxy.server.keys import METRICS
from proxy.simulator.openai_upstream import OpenAIUpstream

MODEL = "gpt-4o-mini"
MESSAGES: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]


@dataclass
class Proxy:
    """A running proxy: its app (for metrics), server, settings and base URL."""

    app: web.Application
    server: TestServer
    settings: Settings

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    @property
    def port(self) -> int:
        assert self.server.port is not None
        return self.server.port

    def metric(self, name: str, **labels: str) -> float:
        value = self.app[METRICS].registry.get_sample_value(name, labels or None)
        return value or 0.0


MakeProxy = Callable[..., Awaitable[Proxy]]


@pytest.fixture
async def make_proxy() -> AsyncIterator[MakeProxy]:
    """`await make_proxy(upstream_url, chat=None, **settings)`: a proxy on loopback with the real compaction service.

    `chat` replaces the service (e.g. one built with a failing chain or store); settings go to `Settings`. Window
    probes are off unless a test turns them on, so the upstream sees only what the test sends.
    """
    servers: list[TestServer] = []

    async def start(upstream_url: str, chat: Compaction | None = None, **overrides: Any) -> Proxy:
        settings = Settings(upstream=upstream_url, **{"window_probes": [], "count_probes": [], **overrides})
        app = create_app(settings, chat if chat is not None else CompactionPipeline(settings))
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        servers.append(server)
        return Proxy(app, server, settings)

    yield start
    for server in servers:
        await server.close()


@pytest.fixture
async def proxy(upstream: OpenAIUpstream, make_proxy: MakeProxy) -> Proxy:
    return await make_proxy(upstream.base_url)


def chat_body(stream: bool = False, messages: list[dict[str, Any]] | None = None, **extra: Any) -> bytes:
    """A chat-completion request body."""
    return json.dumps({"model": MODEL, "messages": messages or MESSAGES, "stream": stream, **extra}).encode()


async def post_chat(
    http: aiohttp.ClientSession, proxy: Proxy, body: bytes, **headers: str
) -> tuple[int, CIMultiDict[str], bytes]:
    """POST a chat completion; return status, headers (case-insensitive) and the whole body.

    Sends `Authorization: Bearer sk-test` unless `headers` replace it; an empty value leaves a header out.
    """
    headers = {"Authorization": "Bearer sk-test", "Content-Type": "application/json", **headers}
    headers = {name: value for name, value in headers.items() if value}
    async with http.post(proxy.url + "/v1/chat/completions", data=body, headers=headers) as response:
        return response.status, CIMultiDict(response.headers), await response.read()


async def assert_serving(http: aiohttp.ClientSession, proxy: Proxy) -> None:
    """The proxy still answers: health, a plain chat completion and a whole stream."""
    async with http.get(proxy.url + "/healthz") as response:
        assert response.status == 200
    status, _, body = await post_chat(http, proxy, chat_body())
    assert status == 200, body
    assert json.loads(body)["choices"][0]["message"]["content"] == "ok 2 messages"
    status, _, body = await post_chat(http, proxy, chat_body(stream=True))
    assert status == 200, body
    assert body.endswith(b"data: [DONE]\n\n")


def openai_error(body: bytes) -> dict[str, Any]:
    """The `error` object of an OpenAI-style error body (asserting the shape)."""
    parsed = json.loads(body)
    error = parsed["error"]
    assert set(error) == {"message", "type", "param", "code"}, parsed
    assert isinstance(error["message"], str) and error["message"]
    return dict(error)


async def wait_for(predicate: Callable[[], bool], within: float = 10.0) -> None:
    """Poll `predicate` until it holds, failing after `within` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


class FullBacklogPort:
    """A loopback port whose listen backlog is full: a connect there hangs (SYNs are dropped), never refused."""

    def __enter__(self) -> int:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        port: int = self.listener.getsockname()[1]
        self.fillers: list[socket.socket] = []
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):  # the handshake completes (or not) in the background
                filler.connect(("127.0.0.1", port))
            self.fillers.append(filler)
        return port

    def __exit__(self, *exc: object) -> None:
        for sock in [*self.fillers, self.listener]:
            sock.close()


@pytest.fixture
def full_backlog_port() -> Iterator[int]:
    with FullBacklogPort() as port:
        yield port


def pytest_configure(config: pytest.Config) -> None:
    """Register the `load` marker: the 1,000-stream test (~30 s); CI runs it, `-m "not load"` skips it locally."""
    config.addinivalue_line("markers", "load: heavy load test (1,000 concurrent streams); deselect with -m 'not load'")
