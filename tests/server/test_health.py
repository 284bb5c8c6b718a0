"""The proxy's own endpoints, metrics registration, and graceful shutdown of the real process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry, Counter

from proxy.pipeline.exchange import PassThrough
from proxy.server.keys import READINESS
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.server.helpers import MakeProxy, Proxy
from tests.server.test_config import cli_command


async def test_healthz_readyz_metrics(upstream: OpenAIUpstream, proxy: Proxy) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.url + "/healthz") as response:
            assert response.status == 200
        async with http.get(proxy.url + "/readyz") as response:
            assert response.status == 200
        async with http.get(proxy.url + "/v1/models", headers={"X-Conversation-Id": "conv-1"}) as response:
            assert response.status == 200
        async with http.get(proxy.url + "/metrics") as response:
            text = await response.text()
            assert response.content_type == "text/plain"
        proxy.app[READINESS].stopping()
        async with http.get(proxy.url + "/readyz") as response:
            assert response.status == 503
            assert (await response.json())["status"] == "shutting_down"
    assert 'compaction_proxy_requests_total{route="models",status="200"} 1.0' in text
    assert 'compaction_proxy_upstream_latency_seconds_count{route="models"} 1.0' in text
    assert "compaction_proxy_fail_open_total" in text
    assert all(request.path not in ("/healthz", "/readyz", "/metrics") for request in upstream.requests)


async def test_readyz_is_degraded_while_the_upstream_refuses_connections(make_proxy: MakeProxy) -> None:
    async with OpenAIUpstream() as upstream:
        proxy = await make_proxy(upstream.base_url)
    # The upstream is gone: its port refuses connections.
    body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.url + "/v1/chat/completions", data=body) as response:
            assert response.status == 502
        async with http.get(proxy.url + "/readyz") as response:
            answer = await response.json()
        assert response.status == 200 and answer["status"] == "degraded"
        assert "could not connect to its upstream (connection refused)" in answer["reason"]
        async with OpenAIUpstream(port=upstream.port):
            async with http.post(proxy.url + "/v1/chat/completions", data=body) as response:
                assert response.status == 200
            async with http.get(proxy.url + "/readyz") as response:
                assert await response.json() == {"status": "ready"}


class WithMetrics(PassThrough):
    def __init__(self) -> None:
        self.counter: Counter | None = None

    def register_metrics(self, registry: CollectorRegistry) -> None:
        self.counter = Counter("compaction_proxy_compactions", "Compactions.", ["strategy"], registry=registry)


async def test_the_compaction_side_registers_its_metrics(upstream: OpenAIUpstream, make_proxy: MakeProxy) -> None:
    chat = WithMetrics()
    proxy = await make_proxy(upstream.base_url, chat)
    assert chat.counter is not None
    chat.counter.labels(strategy="sliding_window").inc()
    async with aiohttp.ClientSession() as http, http.get(proxy.url + "/metrics") as response:
        assert 'compaction_proxy_compactions_total{strategy="sliding_window"} 1.0' in await response.text()


async def wait_for_log(stream: asyncio.StreamReader, message: str) -> dict[str, Any]:
    """Read JSON log lines until one has `message`; return it."""
    while True:
        raw = await asyncio.wait_for(stream.readline(), 30)
        assert raw, f"process ended before logging {message!r}"
        entry: dict[str, Any] = json.loads(raw)
        if entry["message"] == message:
            return entry


async def refused_within(url: str, seconds: float) -> bool:
    """Whether connections to `url` start being refused before the deadline (polled; the server is shutting down)."""
    deadline = asyncio.get_running_loop().time() + seconds
    async with aiohttp.ClientSession() as late:
        while asyncio.get_running_loop().time() < deadline:
            try:
                async with late.get(url, timeout=aiohttp.ClientTimeout(total=1)):
                    pass
            except aiohttp.ClientConnectorError:
                return True
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.01)
    return False


async def test_sigterm_lets_an_open_stream_finish_then_exits_0() -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    async def slow_stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n')
        started.set()
        await release.wait()
        await response.write(b'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\n\ndata: [DONE]\n\n')
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", slow_stream)
    async with TestServer(app, host="127.0.0.1") as upstream:
        env = {**os.environ, "COMPACTION_PROXY_LOG_FORMAT": "json", "PYTHONUNBUFFERED": "1"}
        command = [
            *cli_command(),
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--upstream",
            str(upstream.make_url("")),
        ]
        process = await asyncio.create_subprocess_exec(*command, env=env, stderr=subprocess.PIPE)
        assert process.stderr is not None
        try:
            line = await wait_for_log(process.stderr, "listening")
            port = line["addresses"][0].rsplit(":", 1)[1]
            async with aiohttp.ClientSession() as http:
                body = json.dumps({"model": "m", "messages": [], "stream": True}).encode()
                async with http.post(f"http://127.0.0.1:{port}/v1/chat/completions", data=body) as response:
                    await asyncio.wait_for(started.wait(), 10)
                    assert b"content" in await response.content.readuntil(b"\n\n")
                    process.send_signal(signal.SIGTERM)
                    await wait_for_log(process.stderr, "shutting down")
                    # Shutdown closes the listening socket first: new connections are refused while the stream
                    # goes on.
                    assert await refused_within(f"http://127.0.0.1:{port}/healthz", seconds=10)
                    release.set()
                    rest = await response.content.read()
                    assert rest.endswith(b"data: [DONE]\n\n")
            assert await asyncio.wait_for(process.wait(), 30) == 0
            logs = [json.loads(raw) for raw in (await process.stderr.read()).splitlines()]
            access = [entry for entry in logs if entry["message"] == "request"]
            assert access and access[0]["status"] == 200 and access[0]["route"] == "chat_completions"
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


def test_import_proxy_stays_light() -> None:
    code = "import sys, proxy, proxy.config; assert 'aiohttp' not in sys.modules, 'aiohttp imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
