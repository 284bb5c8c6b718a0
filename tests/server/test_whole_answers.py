"""An answer that arrived whole with its head is relayed in one write; the client gets what the general relay sends.

The fake upstream answers each request in one of two ways. `whole`: head and body in one write, as most non-streamed
answers come (the proxy finds the body in its buffer with the head: `proxy.server.relay.arrived_whole`). `gated`:
the head and half the body, then the rest only once the test's client has seen the proxy's head, so the proxy
cannot have had the whole body when it started answering: it relays as the answer arrives. The client must get
the same status, headers and body both ways, the access line must say the same, and the compaction side must be
told the same outcome.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.server.logging import ACCESS_LOGGER
from tests.server.helpers import MakeProxy, Proxy, Recording
from tests.support.examples import examples

WAY = "X-Test-Way"
"""Request header telling the fake upstream how to send its answer: `whole` or `gated`."""

CHAT = "/v1/chat/completions"

TIMING_FIELDS = frozenset({"latency_ms", "upstream_latency_ms"})
"""Access line fields that differ between any two requests."""

COMPLETION = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14},
    }
)
ERROR = orjson.dumps({"error": {"message": "Rate limit reached.", "type": "requests", "code": "rate_limit_exceeded"}})


@dataclass(frozen=True)
class Answer:
    """What the fake upstream answers: status, headers beside Content-Length, body."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


@dataclass
class GatedUpstream:
    """The fake upstream: answers `answer` whole or gated (see the module docstring)."""

    answer: Answer = Answer(200, (), COMPLETION)
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        answer = self.answer
        headers = [*answer.headers, ("Content-Length", str(len(answer.body)))]
        if request.headers[WAY] == "whole":
            return web.Response(status=answer.status, headers=headers, body=answer.body)
        out = web.StreamResponse(status=answer.status, headers=headers)
        await out.prepare(request)
        half = len(answer.body) // 2
        await out.write(answer.body[:half])
        await self.gate.wait()
        self.gate.clear()
        await out.write(answer.body[half:])
        await out.write_eof()
        return out


class AccessLines(logging.Handler):
    """Hands each access line's fields to the test as it is logged."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.put_nowait(dict(getattr(record, "fields", {})))


@pytest.fixture
async def gated() -> AsyncIterator[tuple[GatedUpstream, str]]:
    upstream = GatedUpstream()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", upstream.handle)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    yield upstream, str(server.make_url("")).rstrip("/")
    await server.close()


@pytest.fixture
def access_lines() -> Iterator[AccessLines]:
    logger = logging.getLogger(ACCESS_LOGGER)
    handler, level = AccessLines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


async def fetch(
    proxy: Proxy, path: str, way: str, upstream: GatedUpstream, lines: AccessLines
) -> tuple[int, list[tuple[str, str]], bytes, dict[str, Any]]:
    """Status, headers (without Date), body and access line (without timings) of one request answered `way`.

    A compacted request's error answer is read whole before the proxy answers (to show it to the compaction side):
    its gate is open from the start.
    """
    buffered = path == CHAT and not 200 <= upstream.answer.status < 300
    if way == "gated" and buffered:
        upstream.gate.set()
    body = orjson.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Say hello."}]})
    async with (
        asyncio.timeout(60),  # a hang fails the test instead of holding the suite
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.post(proxy.url + path, data=body, headers={WAY: way, "Content-Type": "application/json"}) as answer,
    ):
        if way == "gated" and not buffered:
            upstream.gate.set()  # the proxy's head is here: the upstream may send the rest of its body now
        relayed = await answer.read()
        headers = [(name, value) for name, value in answer.headers.items() if name != "Date"]
        status = answer.status
    line = await asyncio.wait_for(lines.lines.get(), 10)
    return status, headers, relayed, {key: value for key, value in line.items() if key not in TIMING_FIELDS}


answers = st.builds(
    Answer,
    st.sampled_from([200, 201, 400, 429, 500]),
    st.lists(
        st.sampled_from(
            [
                ("Content-Type", "application/json"),
                ("X-Request-Id", "req-1"),
                ("openai-processing-ms", "12"),
                ("Keep-Alive", "timeout=5"),
                ("Proxy-Thing", "dropped"),
                ("Content-Encoding", "gzip"),
                ("retry-after", "3"),
            ]
        ),
        unique=True,
        max_size=4,
    ).map(tuple),
    st.sampled_from([COMPLETION, ERROR, b"not json", b"x" * 70_000]),
)


@settings(max_examples=examples(50), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=answers, path=st.sampled_from([CHAT, "/v1/embeddings"]))
async def test_a_whole_answer_is_relayed_as_the_general_relay_relays_it(
    gated: tuple[GatedUpstream, str], make_proxy: MakeProxy, access_lines: AccessLines, answer: Answer, path: str
) -> None:
    upstream, url = gated
    upstream.answer = answer
    chat = Recording()
    proxy = await make_proxy(url, chat)
    whole = await fetch(proxy, path, "whole", upstream, access_lines)
    general = await fetch(proxy, path, "gated", upstream, access_lines)
    assert whole == general
    assert whole[2] == answer.body
    if path == CHAT:
        first, second = await chat.reported(2)
        assert first == second
