"""The process fixture itself: the proxy runs as its own process, configured by environment, and is measurable."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.reliability.conftest import MESSAGES, MODEL
from tests.support.process_proxy import ProcessProxy


async def test_the_proxy_runs_as_a_process_with_settings_from_the_environment() -> None:
    async with OpenAIUpstream() as upstream, ProcessProxy(upstream.base_url, nofile=256, max_headers=50) as proxy:
        assert proxy.pid > 0 and proxy.returncode is None
        limits = Path(f"/proc/{proxy.pid}/limits").read_text().splitlines()  # noqa: ASYNC240 - /proc, instant
        limits = [row for row in limits if row.startswith("Max open files")]
        assert limits[0].split()[3] == "256"
        async with aiohttp.ClientSession() as http:
            async with http.get(proxy.url + "/healthz") as response:
                assert response.status == 200
            body = json.dumps({"model": MODEL, "messages": MESSAGES}).encode()
            headers = {"Authorization": "Bearer sk-test", "Content-Type": "application/json"}
            async with http.post(proxy.url + "/v1/chat/completions", data=body, headers=headers) as response:
                assert response.status == 200
                assert response.headers["X-Compaction"] == "unchanged"
            too_many = {f"X-Filler-{i}": "x" for i in range(60)}  # over max_headers=50, set through the environment
            async with http.get(proxy.url + "/healthz", headers=too_many) as response:
                assert response.status == 400
        record = await proxy.wait_for_log(lambda line: line.get("message") == "request" and line.get("status") == 200)
        assert record["route"] == "chat_completions"
        assert proxy.rss_bytes() > 10 * 1024 * 1024
        assert proxy.logged_bytes >= sum(len(line) + 1 for line in proxy.lines)
    assert proxy.returncode == 0
    assert any(line.get("message") == "stopped" for line in proxy.records())
