"""The real proxy in front of the strict fake Anthropic upstream (a 32k window), both on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from anthropic import AsyncAnthropic

from proxy.simulator.anthropic_upstream import AnthropicUpstream, tool_loop_responder
from tests.support.proxies import LoopbackProxies, RunningProxy

WINDOW = 32_000
NON_BINDING = "claude-sonnet-4-5"
BINDING = "claude-fable-5-1"


@pytest.fixture
def window() -> int:
    """The Claude models' window, for the fake and the proxies; a module that needs another overrides this fixture."""
    return WINDOW


@pytest.fixture
async def upstream(window: int) -> AsyncIterator[AnthropicUpstream]:
    """The fake Messages API: a model that thinks, calls `search` twice per task, then answers."""
    async with AnthropicUpstream(
        context_window=window, responder=tool_loop_responder("search", steps=2, words=60)
    ) as fake:
        yield fake


@pytest.fixture
async def proxies(upstream: AnthropicUpstream, window: int) -> AsyncIterator[LoopbackProxies]:
    """Proxies in front of `upstream` that know the Claude models' window is `window`."""
    started = LoopbackProxies(upstream=upstream.base_url, context_windows={"claude": window})
    yield started
    await started.close()


def base_url(proxy: RunningProxy | AnthropicUpstream) -> str:
    """The `anthropic` SDK's `base_url` for a proxy (or the upstream itself): no `/v1`."""
    return proxy.base_url if isinstance(proxy, AnthropicUpstream) else f"http://127.0.0.1:{proxy.server.port}"


def sdk(proxy: RunningProxy | AnthropicUpstream) -> AsyncAnthropic:
    """The official client at the proxy (or the upstream), with a dummy key and no retries of its own."""
    return AsyncAnthropic(base_url=base_url(proxy), api_key="sk-ant-test", max_retries=0)
