"""Fixtures for the server tests: the fake OpenAI upstream and the real proxy in front of it, both on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from proxy.config import Settings
from proxy.pipeline.exchange import Compaction
from proxy.server import create_app
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.server.helpers import MakeProxy, Proxy


@pytest.fixture
async def make_proxy() -> AsyncIterator[MakeProxy]:
    """Start proxies on loopback port 0: `await make_proxy(upstream_url, chat=None, **settings)`."""
    servers: list[TestServer] = []

    async def start(upstream_url: str, chat: Compaction | None = None, **settings: Any) -> Proxy:
        app = create_app(Settings(upstream=upstream_url, **settings), chat)
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        servers.append(server)
        return Proxy(app, server)

    yield start
    for server in servers:
        await server.close()


@pytest.fixture
async def proxy(upstream: OpenAIUpstream, make_proxy: MakeProxy) -> Proxy:
    return await make_proxy(upstream.base_url)
