"""Chat completions through the proxy: relayed for the OpenAI SDK, reported to the Compaction, fail-open, retry."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from openai import AsyncOpenAI, OpenAI

from proxy.pipeline.exchange import ForwardPlan, IncomingRequest, UpstreamOutcome
from proxy.server.keys import METRICS
from proxy.simulator.openai_upstream import OpenAIUpstream, fixed_responder, tool_loop_responder
from tests.server.helpers import HeldReport, MakeProxy, Proxy, Recording, raw_request

MESSAGES: list[Any] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]


def sdk(proxy: Proxy) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0)


def sync_sdk(proxy: Proxy) -> OpenAI:
    return OpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0)


def metric(proxy: Proxy, name: str, **labels: str) -> float:
    value = proxy.app[METRICS].registry.get_sample_value(name, labels or None)
    return value or 0.0


@dataclass
class InjectUsage(Recording):
    """Asks the upstream for usage the client did not request, and has the server strip it again."""

    async def prepare(self, chat: IncomingRequest) -> ForwardPlan:
        self.prepared.append(chat)
        body = json.loads(chat.body)
        if not body.get("stream") or (body.get("stream_options") or {}).get("include_usage"):
            return ForwardPlan(body=chat.body, stream=bool(body.get("stream")))
        body["stream_options"] = {"include_usage": True}
        return ForwardPlan(
            body=json.dumps(body).encode(),
            stream=True,
            strip_usage_chunk=True,
            response_headers={"X-Compaction": "usage-injected"},
        )


@dataclass
class TrimOnOverflow(Recording):
    """Retries a context overflow once with only the system message and the last message."""

    retry: bool = True

    async def complete(self, plan: ForwardPlan, outcome: UpstreamOutcome) -> ForwardPlan | None:
        await self.record(plan, outcome)
        error = (outcome.error_body or {}).get("error") or {}
        if not self.retry or outcome.status != 400 or error.get("code") != "context_length_exceeded":
            return None
        body = json.loads(plan.body)
        body["messages"] = [body["messages"][0], body["messages"][-1]]
        return ForwardPlan(body=json.dumps(body).encode(), response_headers={"X-Compaction": "retried"})


@dataclass
class Broken(Recording):
    fail_prepare: bool = False
    fail_complete: bool = False
    calls: list[str] = field(default_factory=list)

    async def prepare(self, chat: IncomingRequest) -> ForwardPlan:
        if self.fail_prepare:
            raise RuntimeError("secret body text must not be logged")
        body = json.loads(chat.body)
        body["messages"] = [{"role": "user", "content": "REWRITTEN"}]
        return ForwardPlan(body=json.dumps(body).encode())

    async def complete(self, plan: ForwardPlan, outcome: UpstreamOutcome) -> ForwardPlan | None:
        if self.fail_complete:
            raise ValueError("boom")
        return None


@pytest.fixture
async def recording_proxy(upstream: OpenAIUpstream, make_proxy: MakeProxy) -> tuple[Proxy, Recording]:
    chat = Recording()
    return await make_proxy(upstream.base_url, chat), chat


async def test_non_streaming_async_sdk(upstream: OpenAIUpstream, recording_proxy: tuple[Proxy, Recording]) -> None:
    proxy, chat = recording_proxy
    async with sdk(proxy) as client:
        reply = await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert reply.choices[0].message.content == "ok 2 messages"
    assert upstream.chat_requests[-1]["messages"] == MESSAGES
    [incoming] = chat.prepared
    assert incoming.path == "/v1/chat/completions" and incoming.headers["Authorization"] == "Bearer sk-test"
    [outcome] = await chat.reported(1)
    assert outcome.status == 200
    assert outcome.usage == upstream.usages[-1]
    assert outcome.reply is not None and outcome.reply["content"] == "ok 2 messages"


async def test_a_body_uploaded_in_pieces_reaches_the_compaction_side_whole(
    upstream: OpenAIUpstream, recording_proxy: tuple[Proxy, Recording]
) -> None:
    proxy, chat = recording_proxy
    body = json.dumps({"model": "gpt-4o-mini", "messages": [*MESSAGES, {"role": "user", "content": "x" * 300_000}]})
    encoded = body.encode()

    async def pieces() -> AsyncIterator[bytes]:  # sent chunked
        for start in range(0, len(encoded), 50_000):
            yield encoded[start : start + 50_000]

    async with (
        aiohttp.ClientSession() as http,
        http.post(
            proxy.url + "/v1/chat/completions", data=pieces(), headers={"Content-Type": "application/json"}
        ) as response,
    ):
        assert response.status == 200
        assert response.request_info.headers.get("Transfer-Encoding") == "chunked"
    assert chat.prepared[-1].body == encoded
    assert upstream.chat_requests[-1]["messages"][-1]["content"] == "x" * 300_000


async def test_non_streaming_sync_sdk(upstream: OpenAIUpstream, recording_proxy: tuple[Proxy, Recording]) -> None:
    proxy, chat = recording_proxy

    def call() -> str | None:
        with sync_sdk(proxy) as client:
            return client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES).choices[0].message.content

    assert await asyncio.to_thread(call) == "ok 2 messages"
    [outcome] = await chat.reported(1)
    assert outcome.usage == upstream.usages[-1]


async def test_the_outcome_is_reported_after_the_client_has_its_answer(
    upstream: OpenAIUpstream, make_proxy: MakeProxy
) -> None:
    # Why a test reads outcomes through `reported()`: a sync SDK in a thread could read them before they existed.
    chat = HeldReport()
    proxy = await make_proxy(upstream.base_url, chat)
    async with sdk(proxy) as client:
        reply = await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert reply.choices[0].message.content == "ok 2 messages"
    assert chat.outcomes == []  # the client has its answer; the report is still to come
    waiting = asyncio.ensure_future(chat.reported(1))
    chat.release.set()
    [outcome] = await waiting
    assert outcome.usage == upstream.usages[-1]


async def test_streaming_sdk_sync_and_async(upstream: OpenAIUpstream, recording_proxy: tuple[Proxy, Recording]) -> None:
    proxy, chat = recording_proxy
    upstream.responder = tool_loop_responder("search", steps=1, parallel=2)
    async with sdk(proxy) as client:
        stream = await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True)
        chunks = [chunk async for chunk in stream]
    arguments = "".join(
        call.function.arguments or "" for chunk in chunks for call in (chunk.choices[0].delta.tool_calls or [])
    )
    assert arguments == '{"step": 1, "call": 0}{"step": 1, "call": 1}'
    [outcome] = await chat.reported(1)
    assert outcome.usage is None  # nobody asked for it
    assert outcome.reply is not None
    assert [call["function"] for call in outcome.reply["tool_calls"]] == [
        {"name": "search", "arguments": '{"step": 1, "call": 0}'},
        {"name": "search", "arguments": '{"step": 1, "call": 1}'},
    ]

    upstream.responder = fixed_responder("héllo wörld")

    def call() -> str:
        with sync_sdk(proxy) as client:
            stream = client.chat.completions.create(
                model="gpt-4o-mini", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
            )
            chunks = list(stream)
            assert chunks[-1].usage is not None and chunks[-1].choices == []
            return "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)

    assert await asyncio.to_thread(call) == "héllo wörld"
    outcome = (await chat.reported(2))[-1]
    assert outcome.usage == upstream.usages[-1]
    assert outcome.reply == {"role": "assistant", "content": "héllo wörld"}


def _normalized(stream: bytes) -> bytes:
    """Blank out what differs between two completions of the same request (id, created)."""
    stream = re.sub(rb'"id":"chatcmpl-[^"]*"', b'"id":"X"', stream)
    return re.sub(rb'"created":\d+', b'"created":0', stream)


async def test_injected_usage_is_stripped(
    upstream: OpenAIUpstream, make_proxy: MakeProxy, http: aiohttp.ClientSession
) -> None:
    chat = InjectUsage()
    proxy = await make_proxy(upstream.base_url, chat)
    upstream.responder = tool_loop_responder("lookup", steps=1, parallel=2)
    body = json.dumps({"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True}).encode()

    async with http.post(upstream.base_url + "/v1/chat/completions", data=body) as response:
        direct = await response.read()
    async with http.post(proxy.url + "/v1/chat/completions", data=body) as response:
        assert response.headers["X-Compaction"] == "usage-injected"
        via = await response.read()
    assert b'"usage"' not in via
    assert _normalized(via) == _normalized(direct)  # exactly the stream the client would have seen without the proxy
    assert upstream.chat_requests[-1]["stream_options"] == {"include_usage": True}
    [outcome] = await chat.reported(1)
    assert outcome.usage == upstream.usages[-1]
    assert outcome.reply is not None and len(outcome.reply["tool_calls"]) == 2
    assert outcome.reply["tool_calls"][1]["function"] == {"name": "lookup", "arguments": '{"step": 1, "call": 1}'}
    assert metric(proxy, "compaction_proxy_usage_chunks_stripped_total") == 1

    async with sdk(proxy) as client:
        stream = await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True)
        chunks = [chunk async for chunk in stream]
    assert all(chunk.usage is None and chunk.choices for chunk in chunks)
    assert (await chat.reported(2))[-1].usage == upstream.usages[-1]

    # A client that asked for usage itself gets it.
    async with sdk(proxy) as client:
        stream = await client.chat.completions.create(
            model="gpt-4o-mini", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
    assert chunks[-1].usage is not None


async def test_retry_once_with_a_new_plan(make_proxy: MakeProxy) -> None:
    long_history = [{"role": "user", "content": "word " * 400}, {"role": "assistant", "content": "ok"}]
    messages = [MESSAGES[0], *long_history, MESSAGES[1]]
    async with OpenAIUpstream(context_window=300) as upstream:
        chat = TrimOnOverflow()
        proxy = await make_proxy(upstream.base_url, chat)
        async with sdk(proxy) as client:
            raw = await client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=messages)
            assert raw.headers["X-Compaction"] == "retried"
            assert raw.parse().choices[0].message.content == "ok 2 messages"
            stream = await client.chat.completions.create(model="gpt-4o-mini", messages=messages, stream=True)
            text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
            assert text == "ok 2 messages"
        assert len(upstream.chat_requests) == 4
        assert [outcome.status for outcome in await chat.reported(4)] == [400, 200, 400, 200]
        assert metric(proxy, "compaction_proxy_retries_total") == 2

        chat.retry = False
        async with sdk(proxy) as client:
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        assert caught.value.code == "context_length_exceeded"
        assert len(upstream.chat_requests) == 5


async def test_fail_open_when_prepare_raises(
    upstream: OpenAIUpstream, make_proxy: MakeProxy, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = await make_proxy(upstream.base_url, Broken(fail_prepare=True))
    body = json.dumps({"model": "gpt-4o-mini", "messages": MESSAGES}).encode()
    async with aiohttp.ClientSession() as http, http.post(proxy.url + "/v1/chat/completions", data=body) as response:
        assert response.status == 200
    assert upstream.requests[-1].body == body
    assert metric(proxy, "compaction_proxy_fail_open_total", stage="prepare") == 1
    assert "secret body text" not in caplog.text


async def test_fail_open_when_complete_raises(upstream: OpenAIUpstream, make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(upstream.base_url, Broken(fail_complete=True))
    async with sdk(proxy) as client:
        reply = await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
        assert reply.choices[0].message.content == "ok 1 messages"  # the plan's body went upstream
        stream = await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True)
        assert [chunk async for chunk in stream]
    assert metric(proxy, "compaction_proxy_fail_open_total", stage="complete") == 2


async def test_azure_and_base_path_routes_are_chat(upstream: OpenAIUpstream, make_proxy: MakeProxy) -> None:
    chat = Recording()
    proxy = await make_proxy(upstream.base_url, chat)
    client = openai.AsyncAzureOpenAI(
        azure_endpoint=proxy.url, api_key="azure-key", api_version="2024-10-21", max_retries=0
    )
    async with client:
        reply = await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert reply.choices[0].message.content == "ok 2 messages"
    assert chat.prepared[-1].path == "/openai/deployments/gpt-4o-mini/chat/completions"
    assert upstream.requests[-1].headers["api-key"] == "azure-key"
    assert upstream.requests[-1].query_string == "api-version=2024-10-21"


async def test_client_disconnect_mid_stream_closes_the_upstream(make_proxy: MakeProxy) -> None:
    closed = asyncio.Event()

    async def endless_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            b'10\r\ndata: {"a": 1}\n\n\r\n'
        )
        await writer.drain()
        while await reader.read(65536):  # the proxy sent its body already; wait for it to hang up
            pass
        closed.set()
        writer.close()

    server = await asyncio.start_server(endless_stream, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        chat = Recording()
        proxy = await make_proxy(f"http://127.0.0.1:{port}", chat)
        body = json.dumps({"model": "m", "messages": MESSAGES, "stream": True}).encode()
        async with aiohttp.ClientSession() as http:
            response = await http.post(proxy.url + "/v1/chat/completions", data=body)
            assert await response.content.readuntil(b"\n\n") == b'data: {"a": 1}\n\n'
            response.close()
        await asyncio.wait_for(closed.wait(), timeout=10)
        assert chat.outcomes == []
    finally:
        server.close()


async def test_chat_request_with_odd_path_is_refused(upstream: OpenAIUpstream, proxy: Proxy) -> None:
    status, _, _ = await raw_request(
        proxy.port,
        b"POST /v1/../v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    )
    assert status == 400
    assert upstream.requests == []


async def test_gzip_completion_is_relayed_compressed_and_parsed_from_a_copy(make_proxy: MakeProxy) -> None:
    completion = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "zipped"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
    packed = gzip.compress(json.dumps(completion).encode(), mtime=0)

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=packed, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    async with TestServer(app, host="127.0.0.1") as server:
        chat = Recording()
        proxy = await make_proxy(str(server.make_url("")).rstrip("/"), chat)
        async with aiohttp.ClientSession(auto_decompress=False) as http:
            body = json.dumps({"model": "m", "messages": MESSAGES}).encode()
            async with http.post(proxy.url + "/v1/chat/completions", data=body) as response:
                assert response.headers["Content-Encoding"] == "gzip"
                assert await response.read() == packed
        async with sdk(proxy) as client:
            reply = await client.chat.completions.create(model="m", messages=MESSAGES)
        assert reply.choices[0].message.content == "zipped"
    outcome = (await chat.reported(2))[-1]
    assert outcome.usage == completion["usage"]
    assert outcome.reply == {"role": "assistant", "content": "zipped"}
