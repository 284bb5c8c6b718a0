"""`--workers N`: N proxy processes on one port, sharing conversation state in a real Redis, stopped as one.

The proxy runs as an operator runs it (`tests.support.process_proxy`), with `workers=2`, in front of the OpenAI-like
upstream. Every turn of an agent goes over a new connection, so the kernel spreads them over both workers; what the
upstream receives must still extend byte for byte between compactions, which holds only if each worker replays what
the other remembered. Without a shared store, `--workers 2` is refused at once with a one-line reason.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import pytest

from proxy.simulator.openai_upstream import OpenAIUpstream
from proxy.state.redis import RedisStore
from tests.state.test_replicas import MODEL, WINDOW, forwarded_prompts
from tests.support import process_proxy
from tests.support.agent_run import TOOLS, agent_responder, run_agent

start_process_proxy = process_proxy.start_process_proxy

TENANT_KEY = "shared-tenant-key-for-workers"
WORKERS = 2
T = TypeVar("T")


@pytest.fixture
async def upstream() -> AsyncIterator[OpenAIUpstream]:
    async with OpenAIUpstream(agent_responder(), context_window=WINDOW) as fake:
        yield fake


@pytest.fixture
async def state_url(redis_url: str) -> str:
    """A Redis database of its own, emptied: nothing else in these tests uses database 4."""
    url = redis_url.rsplit("/", 1)[0] + "/4"
    cleaner = RedisStore(url, ttl_seconds=60)
    await cleaner._redis.flushdb()
    await cleaner.close()
    return url


def listening(record: dict[str, Any], worker: int) -> bool:
    return record.get("message") == "listening" and record.get("worker") == worker


async def start_workers(
    start: process_proxy.StartProcessProxy, upstream: OpenAIUpstream, state_url: str, **settings: Any
) -> process_proxy.ProcessProxy:
    """The proxy with `WORKERS` workers (and any further `settings`), once every worker listens."""
    proxy = await start(
        upstream.base_url,
        workers=WORKERS,
        state_url=state_url,
        tenant_key=TENANT_KEY,
        context_windows={MODEL: WINDOW},
        **settings,
    )
    for worker in range(WORKERS):
        await proxy.wait_for_log(
            lambda record, w=worker: record.get("message") == "listening" and record["worker"] == w
        )
    return proxy


async def turn_on_a_new_connection(url: str, messages: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """One model call over a connection of its own (closed after it), so consecutive turns may meet other workers."""
    body = {"model": MODEL, "messages": messages, "tools": TOOLS}
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http,
        http.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-test"}) as response,
    ):
        assert response.status == 200, await response.text()
        answer = await response.json()
        return answer["choices"][0]["message"], response.headers.get("X-Compaction", "")


def worker_pids(proxy: process_proxy.ProcessProxy) -> set[int]:
    return {int(record["pid"]) for record in proxy.records() if record.get("message") == "listening"}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_workers_share_the_port_and_every_conversation(
    start_process_proxy: process_proxy.StartProcessProxy, upstream: OpenAIUpstream, state_url: str
) -> None:
    proxy = await start_workers(start_process_proxy, upstream, state_url)
    assert len(worker_pids(proxy)) == WORKERS

    headers = await run_agent(lambda messages: turn_on_a_new_connection(proxy.url, messages), tasks=3, steps=12)

    served_by = {
        record.get("worker") for record in proxy.records() if record.get("logger") == "compaction_proxy.access"
    }
    assert served_by == set(range(WORKERS)), f"turns were served by workers {served_by} only"
    prompts = forwarded_prompts(upstream)
    assert len(prompts) == len(headers) >= 30
    assert headers.count("compacted") >= 2, headers
    assert "error" not in headers
    for turn, (previous, current, header) in enumerate(zip(prompts, prompts[1:], headers[1:], strict=False), 1):
        if header != "compacted":
            assert current.startswith(previous[:-1]), f"turn {turn} changed the prefix: the workers split the state"


async def test_sigterm_drains_and_stops_every_worker(
    start_process_proxy: process_proxy.StartProcessProxy, state_url: str
) -> None:
    async with OpenAIUpstream(context_window=WINDOW, delay_first_byte=1.0) as slow:
        proxy = await start_workers(start_process_proxy, slow, state_url)
        pids = worker_pids(proxy)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
        async with aiohttp.ClientSession() as http:
            request = asyncio.ensure_future(
                http.post(f"{proxy.url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-test"})
            )
            # The upstream records a request before its delay; it keeps no event to wait on, so look until it has one.
            while not slow.requests:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            os.kill(proxy.pid, signal.SIGTERM)
            async with await request as response:
                assert response.status == 200
                assert (await response.json())["choices"][0]["message"]["role"] == "assistant"
        assert await proxy.stop() == 0, "\n".join(proxy.lines[-30:])
    assert not [pid for pid in pids if alive(pid)]
    assert [record["message"] for record in proxy.records()][-1] == "stopped"


def test_more_than_one_worker_without_a_shared_store_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "serve", "--workers", "2", "--port", "0"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=process_proxy.REPOSITORY_ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")},
    )
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert "workers (2) needs a shared state_url" in line
    assert "state_url to a Redis" in line


def metric(exposition: str, sample: str) -> float:
    """The value of one sample line (`name{labels}`) of a Prometheus exposition; 0 when absent."""
    found = [line.rsplit(" ", 1)[1] for line in exposition.splitlines() if line.startswith(sample + " ")]
    return float(found[0]) if found else 0.0


async def scrape(url: str) -> str:
    """`/metrics` over a connection of its own, so consecutive scrapes may meet other workers."""
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http,
        http.get(f"{url}/metrics") as response,
    ):
        assert response.status == 200
        return await response.text()


async def until_every_worker(
    proxy: process_proxy.ProcessProxy,
    answered: Callable[[dict[str, Any]], bool],
    act: Callable[[int], Awaitable[T]],
    least: int,
) -> list[T]:
    """`act(0)`, `act(1)`, ... over connections of their own: at least `least` times, and until an access line of
    each worker satisfies `answered`. The kernel spreads connections by a hash and a worker writes its access line
    after it answers, so a fixed number of them may not show every worker yet."""
    results: list[T] = []
    while True:
        served = {
            record["worker"]
            for record in proxy.records()
            if record.get("logger") == "compaction_proxy.access" and answered(record)
        }
        if len(results) >= least and served == set(range(WORKERS)):
            return results
        assert len(results) < least + 100, f"{len(results)} connections met only worker(s) {served}"
        results.append(await act(len(results)))


async def test_every_scrape_reports_the_whole_pod(
    start_process_proxy: process_proxy.StartProcessProxy, upstream: OpenAIUpstream, state_url: str
) -> None:
    # At debug, the access lines of /metrics are logged too: they name the worker that answered each scrape.
    proxy = await start_workers(start_process_proxy, upstream, state_url, log_level="debug")
    turns = await until_every_worker(
        proxy,
        lambda record: record.get("route") == "chat_completions",
        lambda turn: turn_on_a_new_connection(proxy.url, [{"role": "user", "content": f"question {turn}"}]),
        least=12,
    )
    requests = len(turns)

    scrapes = await until_every_worker(
        proxy, lambda record: record.get("path") == "/metrics", lambda _: scrape(proxy.url), least=8
    )
    for exposition in scrapes:
        assert metric(exposition, 'compaction_proxy_requests_total{route="chat_completions",status="200"}') == requests
        decided = 'compaction_proxy_outcomes_total{api="chat_completions",outcome="unchanged"}'
        assert metric(exposition, decided) == requests
        assert metric(exposition, "compaction_proxy_tokens_before_count") == 0  # nothing compacted, in any worker
        assert metric(exposition, "compaction_proxy_in_flight_requests") == 1  # the scrape itself, not one per worker
