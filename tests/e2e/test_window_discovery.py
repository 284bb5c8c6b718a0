"""Window discovery against loopback servers answering like vLLM, llama.cpp, Ollama, LM Studio and TGI.

Each server answers its own probe endpoint(s), 404 on every other, and a minimal chat completion; it records every
request. The proxy must find the window each states on the first request (the response headers say it and where it
came from), ignore a missing, slow, redirecting or lying endpoint without retrying it in a loop, delay a request by
at most `discovery_timeout`, and send a caller's credentials only to an upstream that refuses to answer without them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.config import Settings
from proxy.config.compaction import WINDOW_PROBES
from proxy.discovery.service import probes_for
from tests.reliability.conftest import wait_for
from tests.support.proxies import LoopbackProxies, RunningProxy

MODEL = "acme-local-model"
"""A name no table knows: without discovery its requests go uncompacted."""
PROBING = {"window_probes": list(WINDOW_PROBES), "discovery_timeout": 5.0}
"""A generous budget where the test is about what is found, not how long it may take."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def answer(body: Any, status: int = 200) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.json_response(body, status=status)

    return handle


@dataclass(frozen=True)
class Seen:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class ServerLike:
    """A loopback upstream answering `routes` (method, path) like some server, 404 elsewhere, and chat completions."""

    routes: dict[tuple[str, str], Handler]
    seen: list[Seen] = field(default_factory=list)
    server: TestServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.port}"

    @property
    def probes(self) -> list[Seen]:
        return [seen for seen in self.seen if seen.path != "/v1/chat/completions"]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(Seen(request.method, request.path, dict(request.headers), await request.read()))
        if request.path == "/v1/chat/completions":
            return web.json_response(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "model": MODEL,
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": "Ok."}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": 20, "completion_tokens": 2, "total_tokens": 22},
                }
            )
        route = self.routes.get((request.method, request.path))
        return await route(request) if route else web.json_response({"error": "not found"}, status=404)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[dict[tuple[str, str], Handler]], Awaitable[ServerLike]]]:
    started: list[TestServer] = []

    async def start(routes: dict[tuple[str, str], Handler]) -> ServerLike:
        like = ServerLike(routes)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", like.handle)
        like.server = TestServer(app, host="127.0.0.1", port=0)
        await like.server.start_server()
        started.append(like.server)
        return like

    yield start
    for server in started:
        await server.close()


@pytest.fixture
async def proxies() -> AsyncIterator[LoopbackProxies]:
    running = LoopbackProxies()
    yield running
    await running.close()


async def chat(proxy: RunningProxy, model: str = MODEL, key: str = "sk-alice", **headers: str) -> dict[str, str]:
    """One chat completion through the proxy; its response headers."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hello there."}]}
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            proxy.url + "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}", **headers}
        ) as response,
    ):
        assert response.status == 200, await response.text()
        return dict(response.headers)


def window_of(headers: dict[str, str]) -> tuple[str | None, str | None]:
    return headers.get("X-Compaction-Context-Window"), headers.get("X-Compaction-Window-Source")


async def settled(proxy: RunningProxy) -> None:
    """Wait until no probe run is in flight."""
    await wait_for(lambda: not proxy.service.discovery.running())


OLLAMA_SHOW = {
    "modelfile": "FROM /models/acme.gguf\nPARAMETER num_ctx 3072",
    "parameters": 'num_ctx                        3072\nstop                           "<|eot_id|>"',
    "details": {"family": "llama"},
    "model_info": {"general.architecture": "llama", "llama.context_length": 131072},
}
OLLAMA_SHOW_UNSET = {**OLLAMA_SHOW, "parameters": 'stop                           "<|eot_id|>"'}

SERVERS: dict[str, tuple[dict[tuple[str, str], Handler], int]] = {
    "vllm": (
        {
            ("GET", "/v1/models"): answer(
                {
                    "object": "list",
                    "data": [
                        {"id": "other-model", "object": "model", "max_model_len": 131072},
                        {"id": MODEL, "object": "model", "root": "/models/acme", "max_model_len": 8192},
                    ],
                }
            )
        },
        8192,
    ),
    "llama.cpp": (
        {("GET", "/props"): answer({"default_generation_settings": {"n_ctx": 2048}, "total_slots": 1})},
        2048,
    ),
    # The window Ollama cuts at is num_ctx, not the model's far larger context_length.
    "ollama-num_ctx": ({("POST", "/api/show"): answer(OLLAMA_SHOW)}, 3072),
    "ollama-loaded": (
        {
            ("POST", "/api/show"): answer(OLLAMA_SHOW_UNSET),
            ("GET", "/api/ps"): answer({"models": [{"name": f"{MODEL}:latest", "context_length": 8192}]}),
        },
        8192,
    ),
    "ollama-default": (
        {("POST", "/api/show"): answer(OLLAMA_SHOW_UNSET), ("GET", "/api/ps"): answer({"models": []})},
        2048,
    ),
    "lm-studio": (
        {
            ("GET", "/api/v0/models"): answer(
                {
                    "object": "list",
                    "data": [
                        {"id": MODEL, "state": "loaded", "max_context_length": 32768, "loaded_context_length": 4096}
                    ],
                }
            )
        },
        4096,
    ),
    "tgi": (
        {("GET", "/info"): answer({"model_id": "acme/acme", "max_input_tokens": 3000, "max_total_tokens": 4096})},
        3000,
    ),
}


@pytest.mark.parametrize("kind", list(SERVERS))
async def test_the_window_each_server_states_is_found_on_the_first_request(
    kind: str, serve: Any, proxies: LoopbackProxies
) -> None:
    routes, window = SERVERS[kind]
    upstream = await serve(routes)
    proxy = await proxies.start(upstream=upstream.url, **PROBING)

    assert window_of(await chat(proxy)) == (str(window), "discovered")
    # Probes carry no credential the server did not ask for, and no body but Ollama's own `{"model": ...}`.
    for probe in upstream.probes:
        assert "Authorization" not in probe.headers, probe
        assert probe.body == (orjson.dumps({"model": MODEL}) if probe.path == "/api/show" else b""), probe


async def test_missing_endpoints_change_nothing_and_are_not_asked_again(serve: Any, proxies: LoopbackProxies) -> None:
    upstream = await serve({})
    proxy = await proxies.start(upstream=upstream.url, default_context_window=4096, **PROBING)

    assert window_of(await chat(proxy)) == ("4096", "default")
    await settled(proxy)
    asked = len(upstream.probes)
    assert asked == len(WINDOW_PROBES)
    for _ in range(3):
        assert window_of(await chat(proxy)) == ("4096", "default")
    assert len(upstream.probes) == asked, "a probe that found nothing was asked again at once"


async def test_a_slow_probe_delays_only_the_first_request_and_serves_later_ones(
    serve: Any, proxies: LoopbackProxies
) -> None:
    release = asyncio.Event()

    async def slow_models(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.json_response({"data": [{"id": MODEL, "max_model_len": 8192}]})

    upstream = await serve({("GET", "/v1/models"): slow_models})
    budget = 1.0
    proxy = await proxies.start(
        upstream=upstream.url, default_context_window=4096, window_probes=["openai_models"], discovery_timeout=budget
    )

    started = time.monotonic()
    assert window_of(await chat(proxy)) == ("4096", "default")
    first = time.monotonic() - started
    assert budget <= first < budget + 1.0, first
    started = time.monotonic()
    assert window_of(await chat(proxy)) == ("4096", "default")
    assert time.monotonic() - started < budget, "a second request waited for the same probe"

    release.set()
    await settled(proxy)
    assert window_of(await chat(proxy)) == ("8192", "discovered")
    assert len(upstream.probes) == 1


@pytest.mark.parametrize("value", [-4096, 0, 16, 10**12, "8192", True, 8192.5, None, [8192]])
async def test_nonsense_windows_are_ignored(value: Any, serve: Any, proxies: LoopbackProxies) -> None:
    upstream = await serve(
        {
            ("GET", "/v1/models"): answer({"data": [{"id": MODEL, "max_model_len": value, "meta": {"n_ctx": value}}]}),
            ("GET", "/props"): answer({"default_generation_settings": {"n_ctx": value}, "n_ctx": value}),
            ("POST", "/api/show"): answer({**OLLAMA_SHOW, "parameters": f"num_ctx {value}"}),
            ("GET", "/api/v0/models"): answer({"data": [{"id": MODEL, "loaded_context_length": value}]}),
            ("GET", "/info"): answer({"max_input_tokens": value, "max_input_length": value}),
        }
    )
    proxy = await proxies.start(
        upstream=upstream.url,
        default_context_window=4096,
        window_probes=["openai_models", "llama_cpp_props", "lm_studio_models", "tgi_info"],
        discovery_timeout=5.0,
    )
    assert window_of(await chat(proxy)) == ("4096", "default")
    assert len(upstream.probes) == 4


async def test_a_lying_ollama_falls_back_to_its_smallest_default(serve: Any, proxies: LoopbackProxies) -> None:
    upstream = await serve(
        {
            ("POST", "/api/show"): answer({**OLLAMA_SHOW, "parameters": "num_ctx 99999999999"}),
            ("GET", "/api/ps"): answer({"models": [{"name": MODEL, "context_length": -1}]}),
        }
    )
    proxy = await proxies.start(upstream=upstream.url, **PROBING)
    assert window_of(await chat(proxy)) == ("2048", "discovered")


async def test_a_discovered_window_beats_the_table_without_delaying_the_first_request(
    serve: Any, proxies: LoopbackProxies
) -> None:
    """vLLM serving a Llama 3.1 with `--max-model-len 8192`: the table's 131072 would let prompts overflow it."""
    model = "meta-llama/Llama-3.1-8B-Instruct"
    upstream = await serve({("GET", "/v1/models"): answer({"data": [{"id": model, "max_model_len": 8192}]})})
    proxy = await proxies.start(upstream=upstream.url, window_probes=["openai_models"])

    assert window_of(await chat(proxy, model)) == ("131072", "table")
    await settled(proxy)
    assert window_of(await chat(proxy, model)) == ("8192", "discovered")


async def test_requests_settings_and_errors_still_win_and_ask_nothing(serve: Any, proxies: LoopbackProxies) -> None:
    upstream = await serve({("GET", "/v1/models"): answer({"data": [{"id": MODEL, "max_model_len": 8192}]})})
    configured = await proxies.start(upstream=upstream.url, context_windows={MODEL: 6000}, **PROBING)
    assert window_of(await chat(configured)) == ("6000", "configured")
    assert window_of(await chat(configured, **{"X-Context-Window": "5000"})) == ("5000", "request")
    unprobed = await proxies.start(upstream=upstream.url, window_probes=[])
    assert window_of(await chat(unprobed)) == (None, None)
    assert upstream.probes == []


async def test_credentials_go_only_where_refused_and_the_answer_stays_with_that_tenant(
    serve: Any, proxies: LoopbackProxies
) -> None:
    async def guarded_models(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != "Bearer sk-alice":
            return web.json_response({"error": {"message": "Invalid API key"}}, status=401)
        return web.json_response({"data": [{"id": MODEL, "max_model_len": 8192}]})

    upstream = await serve({("GET", "/v1/models"): guarded_models})
    proxy = await proxies.start(
        upstream=upstream.url, default_context_window=4096, window_probes=["openai_models"], discovery_timeout=5.0
    )

    assert window_of(await chat(proxy, key="sk-alice")) == ("8192", "discovered")
    assert [probe.headers.get("Authorization") for probe in upstream.probes] == [None, "Bearer sk-alice"]
    # Bob's key gets no answer: Alice's window is not his.
    assert window_of(await chat(proxy, key="sk-bob")) == ("4096", "default")
    await settled(proxy)
    assert window_of(await chat(proxy, key="sk-bob")) == ("4096", "default")
    assert window_of(await chat(proxy, key="sk-alice")) == ("8192", "discovered")


async def test_a_redirect_is_not_followed(serve: Any, proxies: LoopbackProxies) -> None:
    elsewhere = await serve({("GET", "/props"): answer({"default_generation_settings": {"n_ctx": 4096}})})

    async def redirect(request: web.Request) -> web.StreamResponse:
        raise web.HTTPTemporaryRedirect(elsewhere.url + "/props")

    upstream = await serve({("GET", "/props"): redirect})
    proxy = await proxies.start(upstream=upstream.url, **PROBING)
    assert window_of(await chat(proxy)) == (None, None)
    assert "/props" in [probe.path for probe in upstream.probes]
    assert elsewhere.seen == []


def test_openais_own_api_is_not_probed_unless_asked() -> None:
    assert probes_for(Settings()) == []
    assert probes_for(Settings(upstream="http://127.0.0.1:8000")) == list(WINDOW_PROBES)
    assert probes_for(Settings(window_probes=["openai_models"])) == ["openai_models"]


def serving(models: list[str]) -> dict[tuple[str, str], Handler]:
    """Routes of a vLLM serving `models`, each with an 8192-token window."""
    data = [{"id": model, "object": "model", "max_model_len": 8192} for model in models]
    return {("GET", "/v1/models"): answer({"object": "list", "data": data})}


def runs(upstream: ServerLike) -> int:
    """Discovery runs the upstream received: each asks `/v1/models` once."""
    return [probe.path for probe in upstream.probes].count("/v1/models")


async def test_a_client_cycling_model_names_starts_at_most_its_budget_of_runs(
    serve: Any, proxies: LoopbackProxies
) -> None:
    """Issue 27: each new name started a run (5 requests to the upstream); 30 names, 30 runs."""
    budget = 10  # probe_runs_per_tenant_per_minute's default: the proxy runs with default settings
    names = [f"cycled-model-{number}" for number in range(3 * budget)]
    upstream = await serve(serving(names))
    proxy = await proxies.start(upstream=upstream.url, **PROBING)
    answers = [await chat(proxy, name, "sk-cycler") for name in names]
    await settled(proxy)

    assert runs(upstream) == budget
    assert len(upstream.probes) == budget * len(WINDOW_PROBES)
    assert [window_of(headers) for headers in answers] == [("8192", "discovered")] * budget + [(None, None)] * (
        2 * budget
    )
    assert {headers["X-Compaction"] for headers in answers[budget:]} == {"unknown-window"}
    assert proxy.metric("compaction_proxy_probe_runs_refused_total", kind="window", bound="tenant") == 2 * budget


async def test_one_tenants_runs_leave_others_theirs_until_the_overall_budget(
    serve: Any, proxies: LoopbackProxies
) -> None:
    alices = [f"alice-model-{number}" for number in range(4)]
    upstream = await serve(serving([*alices, "bob-model", "carol-model"]))
    limits = {"probe_runs_per_tenant_per_minute": 2, "probe_runs_per_minute": 3}
    proxy = await proxies.start(upstream=upstream.url, **PROBING, **limits)
    alice = [window_of(await chat(proxy, name, "sk-alice"))[1] for name in alices]
    bob = window_of(await chat(proxy, "bob-model", "sk-bob"))[1]
    carol = window_of(await chat(proxy, "carol-model", "sk-carol"))[1]

    assert alice == ["discovered", "discovered", None, None]
    assert bob == "discovered"  # alice's spent runs are hers
    assert carol is None  # three runs this minute: the overall bound
    assert runs(upstream) == 3
    assert proxy.metric("compaction_proxy_probe_runs_refused_total", kind="window", bound="tenant") == 2
    assert proxy.metric("compaction_proxy_probe_runs_refused_total", kind="window", bound="overall") == 1
