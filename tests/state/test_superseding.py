"""Superseding a stored plan costs about what reading it costs, through the real proxy on a real redis-server.

Issue 37: when a conversation's key already holds another plan (the overflow retry, a prefix compacted again, another
writer's record), `RedisStore.save_rewrite` compares the two on the event loop, and the comparison scanned the stored
plan once per created message of the new one: 0.4 s at 16,000 entries, about 15 s at 100,000, `/healthz` waiting
all along. A plan that keeps every message (a valid record, 28 bytes) planted under the key a conversation of many
tool results is saved to makes the proxy compare its pruned plan against it; `/healthz` must wait no longer then
than during the same request with nothing planted.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.engine.messages import chain_keys, message_key
from proxy.pipeline.caller import Caller
from proxy.simulator.openai_upstream import OpenAIUpstream
from proxy.state.redis import RedisStore
from tests.state.test_hostile_records import measured_turn
from tests.support.proxies import LoopbackProxies, RunningProxy

MODEL = "gpt-4o-mini"
WINDOW = 1_000_000
"""Large enough that the conversation fits once every older copy of its result is a reference."""
CALLS = 6_000
"""Tool calls in the conversation: the same result each time, so every older copy becomes a created reference."""
REPEATED_RESULT = "".join(f"tests/test_module_{n}.py::test_case PASSED\n" for n in range(40))


def conversation() -> list[dict[str, Any]]:
    """A long tool loop: `CALLS` calls, each with its result, past the window, then a question."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You fix bugs."}]
    for call in range(CALLS):
        call_id = f"call_{call}"
        function = {"name": "read_file", "arguments": f'{{"path": "src/{call}.py"}}'}
        messages.append(
            {"role": "assistant", "tool_calls": [{"id": call_id, "type": "function", "function": function}]}
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": REPEATED_RESULT})
    return [*messages, {"role": "user", "content": "What did you find?"}]


@pytest.fixture
async def proxy(redis_url: str) -> AsyncIterator[RunningProxy]:
    async with OpenAIUpstream(context_window=4 * WINDOW) as upstream:
        proxies = LoopbackProxies(
            upstream=upstream.base_url,
            context_windows={MODEL: WINDOW},
            state_url=redis_url,
            tenant_key=uuid.uuid4().hex,
            offload=False,
        )
        try:
            yield await proxies.start()
        finally:
            await proxies.close()


async def plant_identity(proxy: RunningProxy, api_key: str, messages: list[dict[str, Any]]) -> None:
    """Store a plan keeping every message under the key the conversation's rewrite is looked up and saved at."""
    store = proxy.service.store
    assert isinstance(store, RedisStore)
    scope = Caller.of({"authorization": f"Bearer {api_key}"}, proxy.settings).scope
    head = chain_keys([message_key(message) for message in messages])[-1]
    length = len(messages)
    await store._redis.set(store.rewrite_key(scope, head), b"[1, %d, [[0, %d]]]" % (length, length))


async def test_superseding_a_stored_plan_does_not_hold_the_event_loop(proxy: RunningProxy) -> None:
    messages = conversation()
    await measured_turn(proxy, "sk-warm-up", messages)
    benign = [await measured_turn(proxy, f"sk-benign-{run}", messages) for run in range(2)]
    hostile = []
    for run in range(2):
        await plant_identity(proxy, f"sk-victim-{run}", messages)
        hostile.append(await measured_turn(proxy, f"sk-victim-{run}", messages))
    assert {outcome for *_, outcome in benign + hostile} == {"compacted"}
    benign_wait = max(wait for _cpu, wait, _outcome in benign)
    for _cpu, wait, _outcome in hostile:  # main: 1.98 s against 0.33 s; linear: 0.26 s against 0.24 s
        assert wait < 3 * benign_wait, (wait, benign_wait)
