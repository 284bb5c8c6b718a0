"""The probe budget and per-tenant back-offs, through the real proxy against loopback servers (issue 27).

A client cycling model names used to start a window discovery run (5 to 7 requests to the upstream) for each new
name, multiplying its request rate to the upstream; a client cycling credentials would do the same with exact-count
tries. And one tenant's count the upstream refused put every tenant's exact counting on a back-off of a minute or
more. Now runs start within `probe_runs_per_tenant_per_minute` and `probe_runs_per_minute`, the rest are served with
what is known and counted, and a method's back-off is the failing tenant's own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.config.compaction import DEFAULT_COUNT_PROBES, WINDOW_PROBES
from tests.reliability.conftest import wait_for
from tests.support.counting_upstream import CountingUpstream
from tests.support.proxies import LoopbackProxies, RunningProxy

WINDOW = 8192
DISCOVERING = {"window_probes": list(WINDOW_PROBES), "discovery_timeout": 5.0}
"""A generous wait: each request's run answers within it, so which names were found does not depend on timing."""
COUNTED_MODEL = "acme-local-model"
COUNTING = {"count_probes": list(DEFAULT_COUNT_PROBES), "exact_count_timeout": 5.0}


@pytest.fixture
async def proxies() -> AsyncIterator[LoopbackProxies]:
    running = LoopbackProxies()
    yield running
    await running.close()


class ServesModels:
    """A loopback upstream like vLLM serving `models`: `GET /v1/models` lists them, other probes get 404.

    Each name the client sends is one the upstream would answer a probe about: only the budget stops a run.
    """

    def __init__(self, models: list[str]) -> None:
        self.models = models
        self.probed: list[str] = []
        self._server: TestServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.port}"

    async def __aenter__(self) -> ServesModels:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._server = TestServer(app, host="127.0.0.1", port=0)
        await self._server.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        await self._server.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/chat/completions":
            message = {"role": "assistant", "content": "Ok."}
            usage = {"prompt_tokens": 20, "completion_tokens": 2, "total_tokens": 22}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return web.json_response({"id": "c", "object": "chat.completion", "choices": [choice], "usage": usage})
        self.probed.append(request.path)
        if request.path == "/v1/models":
            data = [{"id": model, "object": "model", "max_model_len": WINDOW} for model in self.models]
            return web.json_response({"object": "list", "data": data})
        return web.json_response({"error": "not found"}, status=404)

    def runs(self) -> int:
        """Discovery runs received: each asks `/v1/models` once."""
        return self.probed.count("/v1/models")


async def chat(proxy: RunningProxy, model: str, key: str, messages: list[dict[str, Any]] | None = None) -> Any:
    """One chat completion through the proxy: the response (headers and status read)."""
    body = {"model": model, "messages": messages or [{"role": "user", "content": "Hello there."}]}
    async with (
        aiohttp.ClientSession() as http,
        http.post(proxy.url + "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as answer,
    ):
        await answer.read()
        return answer


async def refused(proxy: RunningProxy, kind: str, bound: str) -> float:
    """The probe runs refused by `bound`, as the proxy's `/metrics` shows them."""
    async with aiohttp.ClientSession() as http, http.get(proxy.url.removesuffix("/v1") + "/metrics") as answer:
        text = await answer.text()
    line = f'compaction_proxy_probe_runs_refused_total{{bound="{bound}",kind="{kind}"}} '
    return next((float(row.removeprefix(line)) for row in text.splitlines() if row.startswith(line)), 0.0)


async def test_a_client_cycling_model_names_starts_at_most_its_budget_of_discovery_runs(
    proxies: LoopbackProxies,
) -> None:
    budget = 10  # probe_runs_per_tenant_per_minute's default: the proxy runs with default settings
    names = [f"cycled-model-{number}" for number in range(3 * budget)]
    async with ServesModels(names) as upstream:
        proxy = await proxies.start(upstream=upstream.url, **DISCOVERING)
        answers = [await chat(proxy, name, "sk-cycler") for name in names]
        await wait_for(lambda: not proxy.service.discovery.running())

        assert upstream.runs() == budget  # 30 runs (150 probe requests) before the budget
        assert len(upstream.probed) == budget * len(WINDOW_PROBES)
        found = [answer.headers.get("X-Compaction-Window-Source") for answer in answers]
        assert found == ["discovered"] * budget + [None] * (2 * budget)
        assert {answer.headers["X-Compaction"] for answer in answers[budget:]} == {"unknown-window"}
        assert all(answer.status == 200 for answer in answers)
        assert await refused(proxy, "window", "tenant") == 2 * budget


async def test_one_tenants_runs_leave_others_theirs_until_the_overall_budget(proxies: LoopbackProxies) -> None:
    names = [*(f"alice-model-{number}" for number in range(4)), "bob-model", "carol-model"]
    async with ServesModels(names) as upstream:
        limits = {"probe_runs_per_tenant_per_minute": 2, "probe_runs_per_minute": 3}
        proxy = await proxies.start(upstream=upstream.url, **DISCOVERING, **limits)
        alice = [await chat(proxy, f"alice-model-{number}", "sk-alice") for number in range(4)]
        bob = await chat(proxy, "bob-model", "sk-bob")
        carol = await chat(proxy, "carol-model", "sk-carol")

        def source(answer: Any) -> str | None:
            return answer.headers.get("X-Compaction-Window-Source")

        assert [source(answer) for answer in alice] == ["discovered", "discovered", None, None]
        assert source(bob) == "discovered"  # alice's spent budget is hers
        assert source(carol) is None  # three runs this minute: the overall bound
        assert upstream.runs() == 3
        assert await refused(proxy, "window", "tenant") == 2
        assert await refused(proxy, "window", "overall") == 1


def counted_conversation() -> list[dict[str, Any]]:
    return [{"role": "user", "content": "Count the readings of every northern station today, please."}]


async def test_a_tenant_whose_count_is_refused_delays_no_other_tenants_count(proxies: LoopbackProxies) -> None:
    """A count refused for one tenant's bad key used to put every tenant's exact counting on a minute's back-off."""
    async with CountingUpstream("llama.cpp", api_keys=frozenset({"sk-alice"})) as upstream:
        proxy = await proxies.start(upstream=upstream.url, context_windows={COUNTED_MODEL: WINDOW}, **COUNTING)
        for _ in range(2):
            mallory = await chat(proxy, COUNTED_MODEL, "sk-mallory", counted_conversation())
            assert mallory.status == 401  # the upstream's own answer to the request, forwarded
        # Tried once with mallory's key and refused; its next request waits out mallory's own back-off.
        assert [seen.path for seen in upstream.counted()] == ["/apply-template", "/tokenize"]
        alice = await chat(proxy, COUNTED_MODEL, "sk-alice", counted_conversation())
        assert alice.status == 200
        assert alice.headers.get("X-Compaction-Count") == "exact"
        assert {seen.headers["Authorization"] for seen in upstream.counted()[2:]} == {"Bearer sk-alice"}


async def test_a_client_cycling_credentials_tries_counts_within_the_overall_budget(proxies: LoopbackProxies) -> None:
    """Before any method has answered, each try is a probe run: new credentials do not buy new ones past the budget."""
    async with CountingUpstream("none") as upstream:
        settings = {"context_windows": {COUNTED_MODEL: WINDOW}, "probe_runs_per_minute": 3, **COUNTING}
        proxy = await proxies.start(upstream=upstream.url, **settings)
        for number in range(6):
            answer = await chat(proxy, COUNTED_MODEL, f"sk-cycled-{number}", counted_conversation())
            assert answer.status == 200
            assert "X-Compaction-Count" not in answer.headers
        await wait_for(lambda: not proxy.service.exact.counts.running())

        tried = [seen.headers["Authorization"] for seen in upstream.counted()]
        assert sorted(set(tried)) == [f"Bearer sk-cycled-{number}" for number in range(3)]
        assert len(tried) == 3 * len(DEFAULT_COUNT_PROBES)  # /apply-template and /tokenize, 404 each
        assert await refused(proxy, "count", "overall") == 3
