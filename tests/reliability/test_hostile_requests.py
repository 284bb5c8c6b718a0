"""Hostile request bodies get clear answers: limits on messages and content parts, and compressed bodies handled.

Issue 14: a request's cost grew with what the client chose to send, with no limit that answered clearly; and a chat
completion with `Content-Encoding: gzip` was forwarded with compaction silently skipped. Each refusal here is an
OpenAI-style error body that never reaches the upstream; a compressed chat completion (gzip, deflate, and since issue
35 br and zstd) is decompressed (up to `max_body_bytes`), compacted like any other and forwarded uncompressed, while
other routes keep forwarding compressed bodies untouched; a coding the proxy cannot undo goes as it came, and the
client is told it was not compacted.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import logging
import random
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import brotli
import pytest
from backports import zstd

from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.reliability.conftest import MODEL, MakeProxy, Proxy, chat_body, openai_error, post_chat
from tests.reliability.fixed_upstream import FixedUpstream

QUICKLY = 20
"""A request over a limit is refused within this many times the test's own `json.loads` of it: the check comes
before any work proportional to what lies past the limit."""


def text_parts(count: int) -> list[dict[str, str]]:
    return [{"type": "text", "text": f"part {index}"} for index in range(count)]


def assert_refused(status: int, body: bytes, expected_status: int, code: str) -> dict[str, Any]:
    """The answer is `expected_status` with an OpenAI-style error body of type `invalid_request_error` and `code`."""
    assert status == expected_status, body
    error = openai_error(body)
    assert (error["type"], error["code"]) == ("invalid_request_error", code)
    return error


# ---- messages and content parts -------------------------------------------------------------------------------------


async def test_limits_on_messages_and_parts_answer_400_at_the_boundary(
    upstream: OpenAIUpstream, make_proxy: MakeProxy, http: aiohttp.ClientSession
) -> None:
    proxy = await make_proxy(upstream.base_url, max_messages=20, max_content_parts=12)
    at_limit = [{"role": "user", "content": f"message {index}"} for index in range(20)]
    status, _, body = await post_chat(http, proxy, chat_body(messages=at_limit))
    assert status == 200, body
    parts_at_limit = [{"role": "user", "content": text_parts(6)}, {"role": "user", "content": text_parts(6)}]
    status, _, body = await post_chat(http, proxy, chat_body(messages=parts_at_limit))
    assert status == 200, body
    upstream.clear()

    over = [*at_limit, {"role": "user", "content": "one more"}]
    status, _, body = await post_chat(http, proxy, chat_body(messages=over))
    assert assert_refused(status, body, 400, "too_many_messages")["param"] == "messages"
    # Parts count over all messages, not per message.
    parts_over = [*parts_at_limit, {"role": "user", "content": text_parts(1)}]
    status, _, body = await post_chat(http, proxy, chat_body(messages=parts_over))
    assert assert_refused(status, body, 400, "too_many_content_parts")["param"] == "messages"
    assert upstream.requests == []


@pytest.mark.parametrize(
    ("messages", "code"),
    [
        pytest.param(
            [{"role": "user", "content": "m"} for _ in range(100_001)], "too_many_messages", id="100001-messages"
        ),
        pytest.param([{"role": "user", "content": text_parts(100_001)}], "too_many_content_parts", id="100001-parts"),
    ],
)
async def test_default_limits_refuse_quickly(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession, messages: list[dict[str, Any]], code: str
) -> None:
    body = chat_body(messages=messages)
    started = time.perf_counter()
    json.loads(body)
    parsed = time.perf_counter() - started
    started = time.perf_counter()
    async with asyncio.timeout(30):  # today's code forwards it (slowly): fail on the status, not on a hang
        status, _, answer = await post_chat(http, proxy, body)
    elapsed = time.perf_counter() - started
    assert assert_refused(status, answer, 400, code)["param"] == "messages"
    assert elapsed < QUICKLY * parsed, (elapsed, parsed)
    assert upstream.requests == []


# ---- compressed bodies ----------------------------------------------------------------------------------------------

PARAGRAPH = "The deploy failed because the migration locked the orders table for eleven minutes. "


def long_conversation() -> list[dict[str, Any]]:
    """About 6,000 tokens: compacted under a 3,000-token window."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for turn in range(30):
        messages.append({"role": "user", "content": f"Question {turn}: " + PARAGRAPH * 4})
        messages.append({"role": "assistant", "content": PARAGRAPH * 4})
    messages.append({"role": "user", "content": "What went wrong?"})
    return messages


ENCODINGS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda data: gzip.compress(data, mtime=0),
    "deflate": zlib.compress,  # HTTP's "deflate" is the zlib format
    "br": brotli.compress,
    "zstd": zstd.compress,
}


async def post_encoded(
    http: aiohttp.ClientSession, proxy: Proxy, path: str, body: bytes, encoding: str, **headers: str
) -> tuple[int, dict[str, str], bytes]:
    sent = {"Authorization": "Bearer sk-test", "Content-Type": "application/json", "Content-Encoding": encoding}
    async with http.post(proxy.url + path, data=body, headers={**sent, **headers}) as response:
        return response.status, dict(response.headers), await response.read()


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
async def test_compressed_chat_bodies_are_compacted_and_other_routes_forward_them_untouched(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession, encoding: str
) -> None:
    messages = long_conversation()
    compressed = ENCODINGS[encoding](chat_body(messages=messages))
    status, headers, body = await post_encoded(
        http, proxy, "/v1/chat/completions", compressed, encoding, **{"X-Context-Window": "3000"}
    )
    assert status == 200, body
    assert headers.get("X-Compaction") == "compacted"
    forwarded = upstream.requests[-1]
    assert "Content-Encoding" not in forwarded.headers
    assert forwarded.json is not None and forwarded.json["model"] == MODEL
    assert 1 < len(forwarded.json["messages"]) < len(messages)

    plain = json.dumps({"model": "text-embedding-3-small", "input": "hello"}).encode()
    other = ENCODINGS[encoding](plain)
    status, _, _ = await post_encoded(http, proxy, "/echo/v1/embeddings", other, encoding)
    assert status == 200
    # The fake's server decodes what it reads: the compressed length on the wire, and the coding, show it was relayed.
    relayed = upstream.requests[-1]
    assert relayed.headers["Content-Encoding"] == encoding
    assert relayed.headers["Content-Length"] == str(len(other))
    assert relayed.body == plain


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
async def test_bad_compressed_chat_bodies_are_refused_clearly(
    upstream: OpenAIUpstream, make_proxy: MakeProxy, http: aiohttp.ClientSession, encoding: str
) -> None:
    limit = 1024 * 1024
    proxy = await make_proxy(upstream.base_url, max_body_bytes=limit)
    # A bomb: 20 KB on the wire (a few hundred bytes in br and zstd), 8 MiB inflated, past max_body_bytes.
    padding = " " * (8 * limit)
    bomb = ENCODINGS[encoding](b'{"model": "gpt-4o-mini", "messages": []' + padding.encode() + b"}")
    assert len(bomb) < limit
    status, _, body = await post_encoded(http, proxy, "/v1/chat/completions", bomb, encoding)
    assert_refused(status, body, 413, "request_too_large")

    corrupt = ENCODINGS[encoding](chat_body())[:20] + b"\x00not compressed at all\xff" * 4
    status, _, body = await post_encoded(http, proxy, "/v1/chat/completions", corrupt, encoding)
    assert_refused(status, body, 400, "invalid_content_encoding")
    assert upstream.requests == []


async def test_a_coding_the_proxy_cannot_undo_is_forwarded_as_it_came_and_said_so(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession
) -> None:
    coded = b"\x1f\x9d" + chat_body()  # `compress` (LZW): no decoder in the proxy, nor in the upstream
    _, headers, _ = await post_encoded(http, proxy, "/v1/chat/completions", coded, "compress")
    assert headers["X-Compaction"] == "skipped"
    assert "'compress' cannot be undone by the proxy" in headers["X-Compaction-Warning"]
    [forwarded] = upstream.requests
    assert (forwarded.body, forwarded.headers["Content-Encoding"]) == (coded, "compress")
    assert proxy.metric("compaction_proxy_decisions_total", route="chat_completions", decision="skipped") == 1


# ---- gzip member floods -------------------------------------------------------------------------------------------

MEMBERED = ("gzip", "zstd")
"""The codings whose bodies may hold several streams, one after another: gzip's members, zstd's frames."""


def member_flood(size: int, encoding: str) -> bytes:
    """A body of empty members (20 bytes each in gzip, 9 in zstd): 200,000 and more of them in 4 MiB."""
    empty = ENCODINGS[encoding](b"")
    return empty * (size // len(empty))


def ordinary_body(size: int, encoding: str) -> bytes:
    """A chat completion that the coding shrinks to about `size` bytes in one stream (base64 text compresses ~25%)."""
    text = base64.b64encode(random.Random(7).randbytes(size)).decode()
    return ENCODINGS[encoding](chat_body(messages=[{"role": "user", "content": text}]))


async def cpu_of(request: Awaitable[tuple[int, dict[str, str], bytes]]) -> tuple[float, int, bytes]:
    """CPU seconds of this whole process (proxy, client, upstream, worker threads) spent on `request`."""
    started = time.process_time()
    status, _, body = await request
    return time.process_time() - started, status, body


@pytest.mark.parametrize("encoding", MEMBERED)
async def test_a_4_mib_member_flood_costs_less_than_an_ordinary_body_of_its_size(
    make_proxy: MakeProxy, http: aiohttp.ClientSession, encoding: str
) -> None:
    """Issue 27: each member's remainder was copied again (16.6 s of CPU for 4 MiB); now it is refused at once."""
    size = 4 * 1024 * 1024
    flood, ordinary = member_flood(size, encoding), ordinary_body(size, encoding)
    async with FixedUpstream() as upstream:
        proxy = await make_proxy(upstream.base_url)
        path = "/v1/chat/completions"
        # warm up: the first request of a proxy pays for its imports and connections
        await post_encoded(http, proxy, path, ENCODINGS[encoding](chat_body()), encoding, **{"X-Compaction": "off"})
        baseline, status, body = await cpu_of(
            post_encoded(http, proxy, path, ordinary, encoding, **{"X-Compaction": "off"})
        )
        assert status == 200, body
        cost, status, body = await cpu_of(post_encoded(http, proxy, path, flood, encoding))
    assert_refused(status, body, 400, "too_many_gzip_members")
    assert "max_gzip_members" in openai_error(body)["message"]
    assert proxy.metric("compaction_proxy_content_coding_refusals_total", code="too_many_gzip_members") == 1
    assert upstream.requests == 2
    print(f"4 MiB {encoding} member flood: {cost:.3f} s of CPU; an ordinary 4 MiB body: {baseline:.3f} s")
    assert cost < baseline


@pytest.mark.parametrize("encoding", MEMBERED)
async def test_decoding_members_costs_time_linear_in_the_body(
    make_proxy: MakeProxy, http: aiohttp.ClientSession, encoding: str
) -> None:
    """With no member bound to stop it, 4 times the members cost about 4 times the CPU, not 16 times (quadratic)."""
    async with FixedUpstream() as upstream:
        proxy = await make_proxy(upstream.base_url, max_gzip_members=10**9)
        path = "/v1/chat/completions"
        costs = []
        for size in (1024 * 1024, 4 * 1024 * 1024):
            cost, status, body = await cpu_of(post_encoded(http, proxy, path, member_flood(size, encoding), encoding))
            assert status == 200, body  # an empty body, forwarded for the upstream to judge
            costs.append(cost)
    print(f"{encoding} member floods of 1 and 4 MiB: {costs[0]:.3f} s and {costs[1]:.3f} s of CPU")
    assert costs[1] < 8 * costs[0]


# ---- JSON nested deeper than the proxy can write back -------------------------------------------------------------


def nested(depth: int) -> Any:
    """`depth` arrays, each holding the next: `[[...[]...]]`."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def deep_tool(depth: int) -> dict[str, Any]:
    """A function tool whose schema's `enum` nests `depth` levels deep within the request body."""
    schema = {"type": "object", "properties": {"x": {"enum": [nested(depth - 8)]}}}
    return {"type": "function", "function": {"name": "deep", "parameters": schema}}


@pytest.mark.parametrize(
    "case",
    [(api, padding) for api in ("chat", "responses") for padding in (0, 2 * 1024 * 1024)],  # both parsers: from 1 MiB
    ids=["chat-small", "chat-large", "responses-small", "responses-large"],
)
async def test_json_nested_deeper_than_the_proxy_writes_is_forwarded_untouched_without_an_error(
    upstream: OpenAIUpstream,
    proxy: Proxy,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    case: tuple[str, int],
) -> None:
    """Issue 27: 255 to 1,024 levels parsed but could not be written back: an ERROR and a traceback per request."""
    api, padding = case
    tools = [deep_tool(600)]
    text = "Say hi " + "x" * padding
    if api == "chat":
        path, document = "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": text}]}
        tool_calls = tools
    else:
        function = tools[0]["function"]
        path, document = "/v1/responses", {"model": MODEL, "input": text}
        tool_calls = [{"type": "function", "name": function["name"], "parameters": function["parameters"]}]
    sent = json.dumps({**document, "tools": tool_calls}).encode()
    headers = {"Authorization": "Bearer sk-test", "Content-Type": "application/json", "X-Context-Window": "3000"}
    with caplog.at_level(logging.INFO):
        async with http.post(proxy.url + path, data=sent, headers=headers) as response:
            await response.read()
    assert upstream.requests[-1].body == sent
    assert [record for record in caplog.records if record.levelno >= logging.WARNING] == []
    api_label = "chat_completions" if api == "chat" else "responses"
    assert proxy.metric("compaction_proxy_outcomes_total", api=api_label, outcome="too_deep") == 1


async def test_a_deep_message_appended_to_a_known_conversation_is_forwarded_untouched_without_an_error(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    """A re-sent conversation is recognized from its bytes, its new messages parsed alone: they are checked too."""
    messages = [{"role": "system", "content": "Be brief. " * 4000}, *long_conversation()[1:]]  # spliced from 32 KiB
    status, _, body = await post_chat(http, proxy, chat_body(messages=messages))
    assert status == 200, body
    deep = {"role": "user", "content": "And now?", "name": "x", "tool_calls": nested(400)}
    sent = chat_body(messages=[*messages, {"role": "assistant", "content": "ok"}, deep])
    with caplog.at_level(logging.INFO):
        await post_chat(http, proxy, sent)
    assert upstream.requests[-1].body == sent
    assert [record for record in caplog.records if record.levelno >= logging.WARNING] == []
    assert proxy.metric("compaction_proxy_outcomes_total", api="chat_completions", outcome="too_deep") == 1
