"""The same Agent task through the proxy and through our hook in process sends the upstream the same messages.

The hook prunes as the proxy does, with a digest under each placeholder (`proxy.engine.digest`); the hook's own
`ToolResultPruningCompactor` writes Haystack's placeholder alone, as Haystack's does.

One run points a Haystack `Agent`'s `OpenAIChatGenerator` at the real proxy (real compaction service, no hook);
the other gives the Agent our `CompactionHook` with the proxy's defaults and talks to a fresh upstream directly.
Both upstreams drive the same tool loop at the same small window, and record every request they receive.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from haystack.components.agents import Agent
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.dataclasses import ChatMessage
from haystack.hooks.protocol import Hook
from haystack.utils import Secret

from hooks.compaction import (
    ChainCompactor,
    CompactionHook,
    MiddleOutCompactor,
    SlidingWindowCompactor,
    TiktokenTokenCounter,
    ToolResultPruningCompactor,
    UserMessageWindowCompactor,
)
from proxy.config import Settings
from proxy.engine import Strategy, ToolResultPruning
from proxy.pipeline.service import CompactionPipeline
from proxy.server import create_app
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.e2e.conftest import MODEL, WINDOW
from tests.hooks.conftest import SEARCH, stepping_responder

API_KEY_VAR = "SAME_DECISION_TEST_OPENAI_KEY"
STEPS = 30
TASK = "Research alpha thoroughly."


class DigestPruningCompactor(ToolResultPruningCompactor):
    """Pruning as the proxy's chain prunes: Haystack's placeholder followed by the result's digest."""

    def strategies(self) -> list[Strategy]:
        return [ToolResultPruning(with_digest=True)]


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key from the environment for the generators."""
    monkeypatch.setenv(API_KEY_VAR, "sk-test")


def agent_at(base_url: str, hooks: dict[str, list[Hook]] | None = None) -> Agent:
    """An Agent with the `search` tool and a system prompt, its generator at `base_url`."""
    generator = OpenAIChatGenerator(
        api_key=Secret.from_env_var(API_KEY_VAR), model=MODEL, api_base_url=base_url, max_retries=0, timeout=30
    )
    return Agent(
        chat_generator=generator,
        tools=[SEARCH],
        system_prompt="You are a careful research agent. Use the search tool step by step.",
        hooks=hooks or {},
        max_agent_steps=STEPS + 5,
    )


def sent(upstream: OpenAIUpstream) -> list[list[dict[str, Any]]]:
    """The message lists of every chat request the upstream received, reduced to what the model sees."""
    return [
        [normalized(message) for message in request.json["messages"]]
        for request in upstream.requests
        if request.path.endswith("/chat/completions")
    ]


def normalized(message: dict[str, Any]) -> dict[str, Any]:
    """Role, content, tool calls (id, name, parsed arguments) and tool_call_id of one message."""
    calls = [
        {"id": c["id"], "name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"] or "{}")}
        for c in message.get("tool_calls") or ()
    ]
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return {
        "role": message["role"],
        "content": content or None,
        "tool_calls": calls,
        "tool_call_id": message.get("tool_call_id"),
    }


async def test_proxy_and_hook_send_the_same_messages() -> None:
    """Every request, in order, carries the same messages whichever side compacted."""
    async with OpenAIUpstream(stepping_responder(STEPS), context_window=WINDOW) as via_proxy_upstream:
        # The hook offloads only when given a store (`ToolResultOffloadCompactor`): compare with the proxy's off.
        settings = Settings(upstream=via_proxy_upstream.base_url, context_windows={MODEL: WINDOW}, offload=False)
        server = TestServer(create_app(settings, CompactionPipeline(settings)), host="127.0.0.1", port=0)
        await server.start_server()
        try:
            agent = agent_at(f"http://127.0.0.1:{server.port}/v1")
            agent.warm_up()
            await agent.run_async(messages=[ChatMessage.from_user(TASK)])
        finally:
            await server.close()
        through_proxy = sent(via_proxy_upstream)

    hook = CompactionHook(
        compactor=ChainCompactor(
            [DigestPruningCompactor(), UserMessageWindowCompactor(), SlidingWindowCompactor(), MiddleOutCompactor()]
        ),
        context_window=WINDOW,
        compact_at=settings.compact_at,
        compact_to=settings.compact_to,
        token_counter=TiktokenTokenCounter(),
    )
    async with OpenAIUpstream(stepping_responder(STEPS), context_window=WINDOW) as direct_upstream:
        agent = agent_at(direct_upstream.base_url + "/v1", {"before_llm": [hook]})
        agent.warm_up()
        await agent.run_async(messages=[ChatMessage.from_user(TASK)])
        through_hook = sent(direct_upstream)

    assert len(through_proxy) == STEPS + 1
    assert any("\nDigest of search(" in str(m["content"]) for m in through_proxy[-1]), "pruned with digests"
    shrank = sum(len(a) < len(b) for a, b in zip(through_proxy[1:], through_proxy, strict=False))
    assert shrank >= 2, "the proxy compacted fewer than twice"
    for index, (proxied, hooked) in enumerate(zip(through_proxy, through_hook, strict=False)):
        assert proxied == hooked, f"request {index} differs"
    assert len(through_hook) == len(through_proxy)
