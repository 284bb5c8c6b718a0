"""A proxy whose Redis does not answer, or that shares Redis without a tenant key, says so at start-up and in /readyz.

Each proxy runs as its own process (started as an operator starts it) against a real redis-server on loopback, or a
loopback port where nothing listens. Only the proxy's own endpoints are asked, so the upstream is never contacted.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import aiohttp

from tests.state.conftest import _free_port, _start, _stop
from tests.support import process_proxy

start_process_proxy = process_proxy.start_process_proxy

UPSTREAM = "http://127.0.0.1:9"
TENANT_KEY = "t" * 32


async def readyz(proxy: process_proxy.ProcessProxy) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.url}/readyz") as response:
        return response.status, await response.json()


def warnings(proxy: process_proxy.ProcessProxy) -> list[str]:
    return [str(record["message"]) for record in proxy.records() if record.get("level") == "warning"]


async def test_an_unreachable_redis_is_logged_and_readiness_degraded(
    start_process_proxy: process_proxy.StartProcessProxy,
) -> None:
    url = f"redis://127.0.0.1:{_free_port()}/0"  # nothing listens there
    proxy = await start_process_proxy(UPSTREAM, state_url=url, tenant_key=TENANT_KEY)
    await proxy.wait_for_log(lambda record: "state store does not answer" in str(record.get("message")))
    assert await readyz(proxy) == (200, {"status": "degraded", "reason": "state_store_unreachable"})
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.url}/healthz") as response:
        assert response.status == 200
    assert len(warnings(proxy)) == 1, warnings(proxy)


async def test_a_reachable_redis_with_a_tenant_key_is_ready_without_a_word(
    start_process_proxy: process_proxy.StartProcessProxy, redis_url: str
) -> None:
    proxy = await start_process_proxy(UPSTREAM, state_url=redis_url, tenant_key=TENANT_KEY)
    assert await readyz(proxy) == (200, {"status": "ready"})
    assert warnings(proxy) == []


async def test_redis_without_a_tenant_key_is_one_warning(
    start_process_proxy: process_proxy.StartProcessProxy, redis_url: str
) -> None:
    proxy = await start_process_proxy(UPSTREAM, state_url=redis_url)
    record = await proxy.wait_for_log(lambda record: record.get("level") == "warning")
    assert "tenant_key is not set" in record["message"] and "COMPACTION_PROXY_TENANT_KEY" in record["message"]
    assert await readyz(proxy) == (200, {"status": "ready"})
    assert len(warnings(proxy)) == 1, warnings(proxy)


async def test_readiness_follows_redis_going_away(
    start_process_proxy: process_proxy.StartProcessProxy, redis_url: str, tmp_path: Path
) -> None:
    binary = shutil.which("redis-server")
    assert binary is not None  # redis_url would have skipped
    server, url = _start(binary, tmp_path)
    try:
        proxy = await start_process_proxy(UPSTREAM, state_url=url, tenant_key=TENANT_KEY)
        assert (await readyz(proxy))[0] == 200
    finally:
        _stop(server)
    assert await readyz(proxy) == (200, {"status": "degraded", "reason": "state_store_unreachable"})
