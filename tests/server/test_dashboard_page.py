"""The dashboard's plots as a browser draws them after a few minutes: the minutes fill the time axis, the y-axis says
where zero and the middle are, and a minute without traffic is a zero, not a gap."""

from __future__ import annotations

import asyncio
import re

import aiohttp
from prometheus_client import CollectorRegistry

from proxy.server.dashboard import DATA_PATH, RING
from proxy.server.keys import METRICS
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.server.helpers import MakeProxy
from tests.support.chromium import chromium_or_skip, dump_dom

BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Say hello."}]}
TRAFFIC = (2, 0, 1, 0)
"""Requests in each of the minutes the test runs."""


async def counted(registry: CollectorRegistry, requests: int) -> None:
    """Wait until the access accounting, which runs after the client has its answer, has counted `requests`."""
    labels = {"route": "chat_completions", "status": "200"}
    while True:
        if (registry.get_sample_value("compaction_proxy_requests_total", labels) or 0) >= requests:
            return
        await asyncio.sleep(0.01)


async def four_minutes(upstream: OpenAIUpstream, make_proxy: MakeProxy) -> str:
    """A proxy whose ring has kept four minutes of `TRAFFIC` (a clock the test moves), and its base URL."""
    proxy = await make_proxy(upstream.base_url, dashboard=True)
    ring = proxy.app[RING]
    now = [ring.clock()]
    ring.clock = lambda: now[0]
    sent = 0
    async with aiohttp.ClientSession() as http:
        for requests in TRAFFIC:
            for _ in range(requests):
                async with http.post(proxy.url + "/v1/chat/completions", json=BODY) as response:
                    assert response.status == 200
            sent += requests
            await counted(proxy.app[METRICS].registry, sent)
            now[0] += 60
            ring.sample()
    now[0] += 20  # a third of the minute in progress
    return proxy.url


async def test_a_minute_without_traffic_counts_zero(upstream: OpenAIUpstream, make_proxy: MakeProxy) -> None:
    url = await four_minutes(upstream, make_proxy)
    async with aiohttp.ClientSession() as http, http.get(url + DATA_PATH) as response:
        figures = {figure["id"]: figure for figure in (await response.json())["figures"]}
    [requests] = figures["requests"]["series"]
    assert requests["values"] == [*map(float, TRAFFIC), 0.0]
    [cached] = figures["cache"]["series"]
    assert cached["values"][1] is None  # a share has nothing to divide by in a quiet minute: a gap, not a zero


async def test_a_few_minutes_fill_the_time_axis_and_the_y_axis_names_zero_and_its_middle(
    upstream: OpenAIUpstream, make_proxy: MakeProxy
) -> None:
    chromium_or_skip()
    url = await four_minutes(upstream, make_proxy)
    dom = await dump_dom(url + "/dashboard")
    requests = dom[dom.index('data-figure="requests"') :].split("</section>", 1)[0]
    times = re.findall(r'<text[^>]*class="time"[^>]*>([^<]*)</text>', requests)
    levels = re.findall(r'<text[^>]*class="level"[^>]*>([^<]*)</text>', requests)
    assert times == ["4 min ago", "2 min ago", "now"]  # from the oldest point kept to now: not "60 min ago"
    assert sorted(levels) == ["0", "1", "2"]
    for figure in dom.split("<section")[1:]:  # no figure repeats a label (a count's middle may round to its top)
        texts = re.findall(r'<text[^>]*class="level"[^>]*>([^<]*)</text>', figure)
        assert texts and len(texts) == len(set(texts))
    circles = [float(x) for x in re.findall(r'<circle cx="([\d.]+)"', requests)]
    assert len(circles) == len(TRAFFIC) + 1 and min(circles) < 200  # spread over the plot (560 wide)


async def test_the_compacted_share_names_every_api_the_compaction_side_sees(
    upstream: OpenAIUpstream, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(upstream.base_url, dashboard=True)
    async with aiohttp.ClientSession() as http, http.get(proxy.url + DATA_PATH) as response:
        [decisions] = [figure for figure in (await response.json())["figures"] if figure["id"] == "decisions"]
    assert all(api in decisions["divides_by"] for api in ("chat completions", "responses", "Messages API"))
