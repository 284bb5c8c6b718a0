"""The real proxy, with its real compaction service, in front of the OpenAI-like upstream; both on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.support.proxies import LoopbackProxies
from tests.support.wire_formats import FormatCase, Upstream

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
    proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={MODEL: WINDOW})

    async def start(**overrides: Any) -> str:
        return (await proxies.start(**overrides)).url

    yield start
    await proxies.close()


@pytest.fixture
def format_upstream(wire: FormatCase, request: pytest.FixtureRequest) -> Upstream:
    """The fake upstream of the format a test runs for (its `wire` parameter, see `by_format`)."""
    served: Upstream = request.getfixturevalue(wire.upstream_fixture)
    return served


@pytest.fixture
async def format_proxies(format_upstream: Upstream) -> AsyncIterator[LoopbackProxies]:
    """Proxies in front of `format_upstream`; each test names the windows it needs."""
    proxies = LoopbackProxies(upstream=format_upstream.base_url)
    yield proxies
    await proxies.close()
