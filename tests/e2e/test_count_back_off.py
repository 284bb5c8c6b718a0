"""Exact-count tries per tenant and within the probe budget, through the real proxy against a counting server.

One tenant's count the upstream refused (a bad key, a message its template rejects) used to put every tenant's exact
counting on a back-off of a minute or more. The back-off is now the failing tenant's own, and since a client can
cycle credentials, every try made before any counting method has answered is a probe run charged to the budget
(`probe_runs_per_tenant_per_minute`, `probe_runs_per_minute`) window discovery is charged to (issue 27).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from proxy.config.compaction import DEFAULT_COUNT_PROBES
from tests.reliability.conftest import wait_for
from tests.support.counting_upstream import CountingUpstream
from tests.support.proxies import LoopbackProxies, RunningProxy

MODEL = "acme-local-model"
COUNTING = {"count_probes": list(DEFAULT_COUNT_PROBES), "exact_count_timeout": 5.0, "context_windows": {MODEL: 8192}}
"""A generous wait: each count answers within it, so what is counted does not depend on timing."""


@pytest.fixture
async def proxies() -> AsyncIterator[LoopbackProxies]:
    running = LoopbackProxies()
    yield running
    await running.close()


async def chat(proxy: RunningProxy, key: str) -> Any:
    """One chat completion through the proxy: the response (headers and status read)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count the readings of every station, please."}]}
    async with (
        aiohttp.ClientSession() as http,
        http.post(proxy.url + "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as answer,
    ):
        await answer.read()
        return answer


async def test_a_tenant_whose_count_is_refused_delays_no_other_tenants_count(proxies: LoopbackProxies) -> None:
    async with CountingUpstream("llama.cpp", api_keys=frozenset({"sk-alice"})) as upstream:
        proxy = await proxies.start(upstream=upstream.url, **COUNTING)
        for _ in range(2):
            mallory = await chat(proxy, "sk-mallory")
            assert mallory.status == 401  # the upstream's own answer to the request, forwarded
        # Tried once with mallory's key and refused; its next request waits out mallory's own back-off.
        assert [seen.path for seen in upstream.counted()] == ["/apply-template", "/tokenize"]
        alice = await chat(proxy, "sk-alice")
        assert alice.status == 200
        assert alice.headers.get("X-Compaction-Count") == "exact"  # before: not asked, on mallory's back-off
        assert {seen.headers["Authorization"] for seen in upstream.counted()[2:]} == {"Bearer sk-alice"}


async def test_a_client_cycling_credentials_tries_counts_within_the_overall_budget(proxies: LoopbackProxies) -> None:
    """Before any method has answered, each try is a probe run: new credentials buy no tries past the budget."""
    async with CountingUpstream("none") as upstream:
        proxy = await proxies.start(upstream=upstream.url, probe_runs_per_minute=3, **COUNTING)
        for number in range(6):
            answer = await chat(proxy, f"sk-cycled-{number}")
            assert answer.status == 200
            assert "X-Compaction-Count" not in answer.headers
        await wait_for(lambda: not proxy.service.exact.counts.running())

        tried = [seen.headers["Authorization"] for seen in upstream.counted()]
        assert sorted(set(tried)) == [f"Bearer sk-cycled-{number}" for number in range(3)]
        assert len(tried) == 3 * len(DEFAULT_COUNT_PROBES)  # /apply-template and /tokenize, 404 each
        assert proxy.metric("compaction_proxy_probe_runs_refused_total", kind="count", bound="overall") == 3
        assert proxy.metric("compaction_proxy_exact_counts_total", result="refused") == 3
