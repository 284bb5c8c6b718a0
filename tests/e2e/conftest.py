"""The real proxy, with its real compaction service, in front of the OpenAI-like upstream; both on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from proxy.chat.service import ChatCompactionService
from proxy.config import Settings
from proxy.server import create_app
from tests.support.openai_upstream import OpenAIUpstream

MODEL = "gpt-4o-mini"
WINDOW = 4096

StartProxy = Callable[..., Awaitable[str]]


@pytest.fixture
async def upstream() -> AsyncIterator[OpenAIUpstream]:
    async with OpenAIUpstream(context_window=WINDOW) as fake:
        yield fake


@pytest.fixture
async def start_proxy(upstream: OpenAIUpstream) -> AsyncIterator[StartProxy]:
    """`await start_proxy(**settings)` starts a proxy in front of `upstream` and returns its `/v1` base URL."""
    servers: list[TestServer] = []

    async def start(**overrides: Any) -> str:
        settings = Settings(**{"upstream": upstream.base_url, "context_windows": {MODEL: WINDOW}, **overrides})
        server = TestServer(create_app(settings, ChatCompactionService(settings)), host="127.0.0.1", port=0)
        await server.start_server()
        servers.append(server)
        return f"http://127.0.0.1:{server.port}/v1"

    yield start
    for server in servers:
        await server.close()
