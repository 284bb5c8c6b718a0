"""A hostile record in a shared Redis costs what its request costs, through the real proxy on a real redis-server.

Whoever can write to the Redis (another deployment sharing it through `key_prefix`, say) can put a 28-byte rewrite
plan claiming five million kept messages under the key the proxy looks up for a conversation. Expanded before it is
checked, it froze the event loop for seconds. Checked against the prefix its key names first, it is a miss: the
request is compacted afresh, costs about what the same request costs with no such record, `/healthz` answers as it
does during that request, and the refusal is counted, with one WARNING and no ERROR.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from proxy.engine.messages import chain_keys, message_key
from proxy.pipeline.caller import Caller
from proxy.simulator.openai_upstream import OpenAIUpstream
from proxy.state.redis import RedisStore
from tests.support.proxies import LoopbackProxies, RunningProxy

MODEL = "gpt-4o-mini"
WINDOW = 4096
CLAIMED = 5_000_000
HOSTILE = b"[1, %d, [[0, %d]]]" % (CLAIMED, CLAIMED)


def conversation() -> list[dict[str, Any]]:
    """A conversation past the trigger of a 4k window: its rewrite is looked up, and it is compacted."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You review code."}]
    for turn in range(24):
        messages.append({"role": "user", "content": f"Step {turn}: " + "read the next file and report. " * 40})
        messages.append({"role": "assistant", "content": f"Done with step {turn}."})
    return [*messages, {"role": "user", "content": "Summarize."}]


@pytest.fixture
async def proxy(redis_url: str) -> AsyncIterator[RunningProxy]:
    async with OpenAIUpstream(context_window=4 * WINDOW) as upstream:  # what is forwarded unchanged is answered too
        proxies = LoopbackProxies(
            upstream=upstream.base_url,
            context_windows={MODEL: WINDOW},
            state_url=redis_url,
            tenant_key=uuid.uuid4().hex,
        )
        try:
            yield await proxies.start()
        finally:
            await proxies.close()


async def plant(proxy: RunningProxy, api_key: str, messages: list[dict[str, Any]]) -> None:
    """Write the hostile plan under the key the proxy looks up first for this tenant's conversation."""
    store = proxy.service.store
    assert isinstance(store, RedisStore)
    scope = Caller.of({"authorization": f"Bearer {api_key}"}, proxy.settings).scope
    head = chain_keys([message_key(message) for message in messages])[-1]
    await store._redis.set(store.rewrite_key(scope, head), HOSTILE)
    assert len(HOSTILE) == 28


async def measured_turn(proxy: RunningProxy, api_key: str, messages: list[dict[str, Any]]) -> tuple[float, float, str]:
    """One request: the proxy process's CPU seconds for it, the longest `/healthz` wait meanwhile, its X-Compaction.

    The proxy runs in the test's process, late in a long suite: a full collection of the whole suite's heap falling
    inside one measured turn would stall the loop for a second that is not the proxy's. The collector is run before
    the turn and paused during it, so the wait measured is the proxy's own.
    """
    gc.collect()
    gc.disable()
    try:
        return await _turn(proxy, api_key, messages)
    finally:
        gc.enable()


async def _turn(proxy: RunningProxy, api_key: str, messages: list[dict[str, Any]]) -> tuple[float, float, str]:
    root = proxy.url.removesuffix("/v1")
    waits: list[float] = []
    done = asyncio.Event()

    async def poll(http: aiohttp.ClientSession) -> None:
        while not done.is_set():
            asked = time.perf_counter()
            async with http.get(f"{root}/healthz") as answer:
                assert answer.status == 200
            waits.append(time.perf_counter() - asked)

    async with (
        aiohttp.ClientSession() as http,
        openai.AsyncOpenAI(base_url=proxy.url, api_key=api_key, max_retries=0) as sdk,
    ):
        async with http.get(f"{root}/healthz") as warm:
            assert warm.status == 200
        polling = asyncio.create_task(poll(http))
        started = time.process_time()
        raw = await sdk.chat.completions.with_raw_response.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
        cpu = time.process_time() - started
        done.set()
        await polling
    return cpu, max(waits), raw.headers["x-compaction"]


async def test_a_plan_claiming_millions_of_messages_costs_what_its_request_costs(
    proxy: RunningProxy, caplog: pytest.LogCaptureFixture
) -> None:
    messages = conversation()
    await measured_turn(proxy, "sk-warm-up", messages)  # first-request costs (encodings, connections) paid here
    baselines = [await measured_turn(proxy, f"sk-benign-{run}", messages) for run in range(3)]
    assert {outcome for _cpu, _wait, outcome in baselines} == {"compacted"}
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        hostile = []
        for run in range(2):
            await plant(proxy, f"sk-victim-{run}", messages)
            hostile.append(await measured_turn(proxy, f"sk-victim-{run}", messages))
    baseline_cpu = min(cpu for cpu, _wait, _outcome in baselines)
    baseline_wait = max(wait for _cpu, wait, _outcome in baselines)
    print(f"hostile plan: {max(cpu for cpu, *_ in hostile):.3f} s of CPU; the same request alone: {baseline_cpu:.3f} s")
    for cpu, wait, outcome in hostile:
        assert cpu < 3 * baseline_cpu, (cpu, baseline_cpu)
        assert wait < 50 * baseline_wait, (wait, baseline_wait)  # seconds against milliseconds before the check
        assert outcome == "compacted"  # a miss: compacted afresh, as the benign requests were
    assert [record.levelno for record in caplog.records if record.name.startswith("compaction_proxy")] == [
        logging.WARNING
    ]
    assert "5000000" not in caplog.text
    async with aiohttp.ClientSession() as http, http.get(proxy.url.removesuffix("/v1") + "/metrics") as got:
        metrics = await got.text()
    # Each refused twice: when looked up, and when the request's own plan replaced it.
    assert 'compaction_proxy_state_records_rejected_total{kind="rewrite"} 4.0' in metrics


async def test_a_plan_with_a_message_too_deep_to_write_is_a_miss_not_an_error_per_request(
    proxy: RunningProxy, caplog: pytest.LogCaptureFixture
) -> None:
    """A created message nested 300 levels reads (orjson reads 1,024) but cannot be written back (254): replayed, it
    made every request of the conversation fail open with an ERROR, for as long as the record lived."""
    messages = conversation()
    store = proxy.service.store
    assert isinstance(store, RedisStore)
    scope = Caller.of({"authorization": "Bearer sk-deep"}, proxy.settings).scope
    head = chain_keys([message_key(message) for message in messages])[-1]
    deep = b"[" * 300 + b"]" * 300
    created = b'{"m": {"role": "user", "content": %s}, "t": {}}' % deep
    await store._redis.set(
        store.rewrite_key(scope, head), b"[1, %d, [%s, [1, %d]]]" % (len(messages), created, len(messages))
    )
    with caplog.at_level(logging.WARNING):
        outcomes = [(await measured_turn(proxy, "sk-deep", messages))[2] for _ in range(2)]
    assert outcomes[0] == "compacted", "a miss: compacted afresh, and its own plan replaces the record"
    assert "error" not in outcomes
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]
