"""Isolation and secrets: callers share no state, logs carry no credential and no message text, the proxy talks to
its configured upstream only, and optional proxy keys guard a shared gateway.

Already covered elsewhere: rewrites are not shared between two `Authorization` credentials (tests/e2e), dot segments,
asterisk-form and two absolute-form requests (tests/server). Here: anchors (seen through the estimate headers), the
Azure `api-key` header, a log scan of a full run with compaction, errors and fail-open, a hostile server on loopback
that must never be reached, and the proxy keys.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict
from yarl import URL

from proxy.config import Settings, load_settings
from proxy.engine import CompactionChain, Strategy, Transcript
from proxy.engine.plan import EditPlan
from proxy.pipeline.service import CompactionPipeline
from proxy.server.auth import key_matches
from proxy.server.log_formats import JsonFormatter, TextFormatter, logfmt_value
from proxy.server.logging import ACCESS_LOGGER
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.reliability.conftest import MODEL, MakeProxy, Proxy, chat_body, openai_error, post_chat

PARAGRAPH = "The deploy failed because the migration locked the orders table for eleven minutes. "


def conversation(turns: int, marker: str = "") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"You are terse. {marker}"}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn} {marker}: " + PARAGRAPH * 4})
        messages.append({"role": "assistant", "content": PARAGRAPH * 4})
    messages.append({"role": "user", "content": f"What went wrong? {marker}"})
    return messages


def estimate(headers: CIMultiDict[str]) -> str:
    return headers["X-Compaction-Tokens-Before"]


# ---- tenants --------------------------------------------------------------------------------------------------------


async def test_anchors_are_not_shared_between_credentials(make_proxy: MakeProxy, http: aiohttp.ClientSession) -> None:
    async with OpenAIUpstream(context_window=1_000_000) as upstream:
        proxy = await make_proxy(upstream.base_url)
        # Over the trigger in bytes, under it in tokens: estimated by counting, never sized by its bytes alone.
        window = {"X-Context-Window": "2000"}
        first = conversation(3)
        status, _, body = await post_chat(
            http, proxy, chat_body(messages=first), Authorization="Bearer sk-alice", **window
        )
        assert status == 200
        # Alice's next turn is estimated from the usage the provider reported for her first turn (her anchor)...
        turn2 = [*first, json.loads(body)["choices"][0]["message"], {"role": "user", "content": "And then?"}]
        _, alice, _ = await post_chat(http, proxy, chat_body(messages=turn2), Authorization="Bearer sk-alice", **window)
        # ...while Bob, sending the very same messages, is estimated exactly like Carol, who never sent anything.
        _, bob, _ = await post_chat(http, proxy, chat_body(messages=turn2), Authorization="Bearer sk-bob", **window)
        _, carol, _ = await post_chat(http, proxy, chat_body(messages=turn2), Authorization="Bearer sk-carol", **window)
        assert estimate(bob) == estimate(carol)
        assert estimate(alice) != estimate(bob)


async def test_azure_api_keys_are_tenants_too(make_proxy: MakeProxy, http: aiohttp.ClientSession) -> None:
    async with OpenAIUpstream(context_window=1_000_000) as upstream:
        proxy = await make_proxy(upstream.base_url)
        window = {"X-Context-Window": "3000"}
        first = conversation(30)
        following = chat_body(
            messages=[*first, {"role": "assistant", "content": "A lock."}, {"role": "user", "content": "Then?"}]
        )
        a = {"api-key": "azure-a", "Authorization": "", **window}
        b = {"api-key": "azure-b", "Authorization": "", **window}
        _, headers, _ = await post_chat(http, proxy, chat_body(messages=first), **a)
        assert headers["X-Compaction"] == "compacted"
        rewritten = json.loads(upstream.requests[-1].body)["messages"]
        # b's next turn finds none of a's rewrite and is compacted afresh; a's replays it and stays under the trigger.
        _, headers, _ = await post_chat(http, proxy, following, **b)
        assert headers["X-Compaction"] == "compacted"
        _, headers, _ = await post_chat(http, proxy, following, **a)
        assert headers["X-Compaction"] == "unchanged"
        assert json.loads(upstream.requests[-1].body)["messages"][: len(rewritten)] == rewritten


async def test_every_credential_header_scopes_the_tenant(make_proxy: MakeProxy, http: aiohttp.ClientSession) -> None:
    async with OpenAIUpstream(context_window=1_000_000) as upstream:
        proxy = await make_proxy(upstream.base_url)
        long = chat_body(messages=conversation(30))
        shared = "Bearer placeholder"  # e.g. a gateway that sets a fixed Authorization and routes by api-key
        _, headers, _ = await post_chat(
            http, proxy, long, Authorization=shared, **{"api-key": "azure-a", "X-Context-Window": "3000"}
        )
        assert headers["X-Compaction"] == "compacted"
        _, headers, _ = await post_chat(
            http, proxy, long, Authorization=shared, **{"api-key": "azure-b", "X-Context-Window": "100000"}
        )
        assert upstream.requests[-1].body == long  # b must not get a's remembered rewrite


# ---- logs ---------------------------------------------------------------------------------------------------------


class LeakyStrategy(Strategy):
    """A strategy that fails with the conversation's text in its exception, as a careless bug would."""

    name = "leaky"

    def _propose(self, transcript: Transcript, target_tokens: int) -> EditPlan | None:
        raise ValueError(f"cannot compact {transcript.messages[-1].get('content')!r}")


@pytest.fixture
def captured_logs() -> Iterator[io.StringIO]:
    """Every log record of the run, at DEBUG and up, rendered as the proxy writes them to stderr (JSON lines)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    previous = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)


async def test_logs_of_a_full_run_carry_no_credentials_and_no_message_text(
    make_proxy: MakeProxy, http: aiohttp.ClientSession, captured_logs: io.StringIO
) -> None:
    keys = ["sk-live-4f9a1c7e2b8d", "azure-9e1d2c3b4a5f", "anthropic-1a2b3c4d5e", "proxykey-7c6b5a4d3e2f1a0b"]
    wrong_key = "proxykey-WRONG-00000000"
    marker = "zebra-quartz-marmalade"
    auth = {"Authorization": f"Bearer {keys[0]}", "X-Proxy-Key": keys[3]}
    async with OpenAIUpstream(context_window=4096) as upstream:
        proxy = await make_proxy(upstream.base_url, context_windows={MODEL: 16_384}, proxy_keys=[keys[3]])
        long = chat_body(messages=conversation(30, marker))
        # compaction, streamed and not, with each credential header
        for headers in (
            auth,
            {"api-key": keys[1], "X-Proxy-Key": keys[3]},
            {"x-api-key": keys[2], "X-Proxy-Key": keys[3]},
        ):
            status, _, _ = await post_chat(http, proxy, long, **headers, **{"X-Context-Window": "3000"})
            assert status == 200
            status, _, _ = await post_chat(
                http, proxy, chat_body(stream=True, messages=conversation(30, marker)), **headers
            )
            assert status == 200
        # an overflow the proxy compacts and retries (the upstream's window is smaller than the proxy believes)
        status, headers, _ = await post_chat(http, proxy, chat_body(messages=conversation(31, marker)), **auth)
        assert status == 200 and headers["X-Compaction"] == "compacted-after-overflow"
        # upstream errors: 500, 429, a reset before the answer and one mid-stream
        for fault in ({"status": 500}, {"status": 429, "headers": {"retry-after": "1"}}, {"reset": True}):
            upstream.fail_next(**fault)
            await post_chat(http, proxy, chat_body(messages=conversation(1, marker)), **auth)
        upstream.fail_next(cut_after_chunks=2)
        with pytest.raises(aiohttp.ClientPayloadError):
            await post_chat(http, proxy, chat_body(stream=True, messages=conversation(1, marker)), **auth)
        # malformed bodies, a refused path, a wrong proxy key, a Proxy-Authorization
        await post_chat(http, proxy, f'{{"messages": [{{"content": "{marker}"'.encode(), **auth)
        await post_chat(
            http, proxy, b'{"model": "m", "messages": [{"content": "\xff' + marker.encode() + b'"}]}', **auth
        )
        async with http.get(URL(proxy.url + "/v1/%2e%2e/secret", encoded=True), headers=auth) as response:
            assert response.status == 400
        status, _, _ = await post_chat(http, proxy, long, **{**auth, "X-Proxy-Key": wrong_key})
        assert status == 401
        status, _, _ = await post_chat(
            http, proxy, long, Authorization=f"Bearer {keys[0]}", **{"Proxy-Authorization": f"Bearer {keys[3]}"}
        )
        assert status == 200
        # fail-open: a strategy that raises with the conversation's text in its message
        settings = Settings(upstream=upstream.base_url, context_windows={MODEL: 16_384})
        leaky = CompactionPipeline(settings, chain=CompactionChain([LeakyStrategy()]))
        failing = await make_proxy(upstream.base_url, leaky, context_windows={MODEL: 16_384})
        status, headers, _ = await post_chat(
            http, failing, long, Authorization=f"Bearer {keys[0]}", **{"X-Context-Window": "3000"}
        )
        assert status == 200 and headers["X-Compaction"] == "error"
        # a client leaving mid-stream
        upstream.stream_chunk_delay = 0.05
        response = await http.post(proxy.url + "/v1/chat/completions", data=chat_body(stream=True), headers=auth)
        await response.content.readuntil(b"\n\n")
        response.close()
        await asyncio.wait_for(upstream.abort_event.wait(), 5)
        upstream.stream_chunk_delay = 0.0
    # an unreachable upstream
    unreachable = await make_proxy("http://127.0.0.1:9", proxy_keys=[keys[3]])
    await post_chat(http, unreachable, long, **auth)

    logs = captured_logs.getvalue()
    assert logs.count('"logger":"compaction_proxy.access"') >= 15  # the run really was logged...
    assert '"fail_open"' in logs or '"level":"error"' in logs  # ...failures included
    for secret in [*keys, wrong_key]:
        assert secret not in logs
    for text in (marker, "Question 1", "eleven minutes", "What went wrong"):
        assert text not in logs


async def test_the_access_line_says_what_compaction_did_and_shares_its_id_with_the_compaction_line(
    make_proxy: MakeProxy, http: aiohttp.ClientSession, captured_logs: io.StringIO
) -> None:
    async with OpenAIUpstream(context_window=4096) as upstream:
        proxy = await make_proxy(upstream.base_url, context_windows={MODEL: 16_384})
        for window in ("3000", "16384"):
            status, _, _ = await post_chat(
                http, proxy, chat_body(messages=conversation(30, "m")), **{"X-Context-Window": window}
            )
            assert status == 200
    records = [json.loads(line) for line in captured_logs.getvalue().splitlines()]
    compacted, unchanged = [r for r in records if r["logger"] == ACCESS_LOGGER and r.get("route") == "chat_completions"]
    assert (compacted["model"], compacted["compaction"], unchanged["compaction"]) == (MODEL, "compacted", "unchanged")
    assert compacted["tokens_after"] < compacted["tokens_before"]
    [decision] = [record for record in records if record["message"] == "Compacted a conversation."]
    assert decision["request_id"] == compacted["request_id"] != unchanged["request_id"]
    assert decision["tokens_after"] == compacted["tokens_after"]


# ---- only ever the configured upstream ---------------------------------------------------------------------------


async def raw(port: int, request: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    except asyncio.IncompleteReadError as exc:
        head = exc.partial
    finally:
        writer.close()
    return int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0


async def test_no_request_can_make_the_proxy_talk_to_another_host(proxy: Proxy, upstream: OpenAIUpstream) -> None:
    async with OpenAIUpstream() as evil:
        there = f"127.0.0.1:{evil.port}".encode()
        requests = [
            b"GET http://" + there + b"/v1/models HTTP/1.1\r\nHost: " + there + b"\r\n\r\n",
            b"POST http://"
            + there
            + b"/v1/chat/completions HTTP/1.1\r\nHost: "
            + there
            + b"\r\nContent-Length: 2\r\n\r\n{}",
            b"GET https://user@" + there + b"/v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET //" + there + b"/v1/models HTTP/1.1\r\nHost: " + there + b"\r\n\r\n",
            b"GET /v1/models HTTP/1.1\r\nHost: "
            + there
            + b"\r\nX-Forwarded-Host: "
            + there
            + b"\r\nForwarded: host="
            + there
            + b"\r\nX-Original-URL: http://"
            + there
            + b"/\r\n\r\n",
            b"CONNECT " + there + b" HTTP/1.1\r\nHost: " + there + b"\r\n\r\n",
            b"GET @" + there + b"/v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /@" + there + b"/v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /v1/%2e%2e/%2e%2e/" + there + b"/v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /..%2f..%2f" + there + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /v1\\..\\..\\models HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /v1/models HTTP/1.1\r\nHost: " + there + b"\r\nHost: evil.example\r\n\r\n",
            b"GET /v1/models HTTP/1.1\r\nHost: evil.example:1@" + there + b"\r\n\r\n",
        ]
        for request in requests:
            status = await raw(proxy.port, request)
            assert status != 0
        assert evil.requests == []
        for received in upstream.requests:  # whatever was forwarded went to the upstream, as the upstream
            assert received.headers["Host"] == f"127.0.0.1:{upstream.port}"
            assert not received.path.startswith(("http:", "https:"))


# ---- proxy keys ---------------------------------------------------------------------------------------------------

KEY_A = "gateway-key-a-0123456789"
KEY_B = "gateway-key-b-9876543210"


async def test_proxy_keys_guard_every_forwarded_request(
    upstream: OpenAIUpstream, make_proxy: MakeProxy, http: aiohttp.ClientSession
) -> None:
    proxy = await make_proxy(upstream.base_url, proxy_keys=[KEY_A, KEY_B])
    for headers in (
        {},
        {"X-Proxy-Key": "gateway-key-c-0000000000"},
        {"Proxy-Authorization": "Basic Zm9vOmJhcg=="},
        {"X-Proxy-Key": KEY_A[:-1]},
        {"Proxy-Authorization": f"Bearer {KEY_A}x"},
    ):
        for stream in (False, True):
            status, answer_headers, body = await post_chat(http, proxy, chat_body(stream=stream), **headers)
            assert status == 401
            error = openai_error(body)
            assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_proxy_key")
            assert answer_headers["WWW-Authenticate"].startswith("Bearer")
        async with http.get(proxy.url + "/v1/models", headers=headers) as response:
            assert response.status == 401
    assert upstream.requests == []
    assert proxy.metric("compaction_proxy_requests_total", route="chat_completions", status="401") == 10

    for headers in ({"X-Proxy-Key": KEY_A}, {"X-Proxy-Key": KEY_B}, {"Proxy-Authorization": f"Bearer {KEY_B}"}):
        status, _, body = await post_chat(http, proxy, chat_body(stream=True), **headers)
        assert status == 200 and body.endswith(b"data: [DONE]\n\n")
        received = upstream.requests[-1].headers
        assert "X-Proxy-Key" not in received and "Proxy-Authorization" not in received  # stripped
        assert received["Authorization"] == "Bearer sk-test"  # the provider credential passes untouched


async def test_probes_stay_open_and_keys_off_by_default(
    upstream: OpenAIUpstream, make_proxy: MakeProxy, http: aiohttp.ClientSession
) -> None:
    guarded = await make_proxy(upstream.base_url, proxy_keys=[KEY_A])
    for path in ("/healthz", "/readyz", "/metrics"):
        async with http.get(guarded.url + path) as response:
            assert response.status == 200
    async with http.post(guarded.url + "/metrics") as response:  # not a probe: forwarded, so guarded
        assert response.status == 401
    open_proxy = await make_proxy(upstream.base_url)
    status, _, _ = await post_chat(http, open_proxy, chat_body())
    assert status == 200
    # X-Proxy-Key is the proxy's own header: it never reaches the upstream, keys configured or not.
    status, _, _ = await post_chat(http, open_proxy, chat_body(), **{"X-Proxy-Key": KEY_A})
    assert status == 200 and "X-Proxy-Key" not in upstream.requests[-1].headers


def test_proxy_keys_from_the_environment_are_validated_and_never_shown() -> None:
    settings = load_settings(environ={"COMPACTION_PROXY_PROXY_KEYS": f"{KEY_A}, {KEY_B}"})
    assert [key.get_secret_value() for key in settings.proxy_keys] == [KEY_A, KEY_B]
    assert KEY_A not in repr(settings) and KEY_A not in str(settings.model_dump())
    settings = load_settings(environ={"COMPACTION_PROXY_PROXY_KEYS": json.dumps([KEY_A])})
    assert len(settings.proxy_keys) == 1
    for bad in ("short", "has space in the middle!", "tab\there-0123456789"):
        with pytest.raises(ValueError) as caught:
            load_settings(environ={"COMPACTION_PROXY_PROXY_KEYS": json.dumps([bad])})
        assert bad not in str(caught.value)


def test_key_comparison_checks_every_pair() -> None:
    import hashlib

    allowed = [hashlib.sha256(key.encode()).digest() for key in (KEY_A, KEY_B)]
    assert key_matches([KEY_B], allowed)
    assert key_matches(["nope", KEY_A], allowed)
    assert not key_matches([], allowed)
    assert not key_matches([KEY_A.upper(), KEY_A + " "], allowed)


# ---- text logs: a client's value is one value --------------------------------------------------------------------

_LOGFMT_PAIR = re.compile(r'(?:^| )(\w+)=("(?:[^"\\]|\\.)*"|\S*)')
_LOGFMT_ESCAPES = {"n": "\n", "r": "\r", "t": "\t"}


def _unescaped(escape: re.Match[str]) -> str:
    code = escape[1]
    return chr(int(code[1:], 16)) if len(code) > 1 else _LOGFMT_ESCAPES.get(code, code)


def logfmt_fields(line: str) -> dict[str, str]:
    """The `key=value` fields of a text log line, as a logfmt reader sees them; a key read twice fails the test."""
    fields: dict[str, str] = {}
    for key, written in _LOGFMT_PAIR.findall(line):
        assert key not in fields, f"{key} appears twice in {line!r}"
        quoted = written.startswith('"')
        fields[key] = re.sub(r"\\(u[0-9a-f]{4}|U[0-9a-f]{8}|.)", _unescaped, written[1:-1]) if quoted else written
    return fields


class _Lines(logging.Handler):
    """Collects each record as `formatter` renders it, and says when the first has arrived."""

    def __init__(self, formatter: logging.Formatter) -> None:
        super().__init__()
        self.setFormatter(formatter)
        self.lines: list[str] = []
        self.arrived = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))
        self.arrived.set()


async def test_text_logs_quote_what_a_client_sends_so_it_cannot_forge_fields(
    proxy: Proxy, http: aiohttp.ClientSession
) -> None:
    """The same access record rendered both ways: the text line holds exactly the JSON line's fields and values."""
    text, structured = _Lines(TextFormatter()), _Lines(JsonFormatter())
    access = logging.getLogger(ACCESS_LOGGER)
    previous = access.level
    access.setLevel(logging.INFO)
    access.addHandler(text)
    access.addHandler(structured)
    forged = 'cid-1 status=200 path=/admin error="none" \\ bytes_out=0'
    try:
        status, _, _ = await post_chat(http, proxy, chat_body(), **{"X-Conversation-Id": forged})
        await asyncio.wait_for(text.arrived.wait(), 10)  # the line is written once the handler has returned
    finally:
        access.removeHandler(text)
        access.removeHandler(structured)
        access.setLevel(previous)
    assert status == 200
    (line,) = text.lines
    written = json.loads(structured.lines[0])
    expected = {key: str(value) for key, value in written.items() if key not in ("time", "level", "logger", "message")}
    assert expected["conversation_id"] == forged and expected["status"] == "200"
    assert logfmt_fields(line) == expected


@given(st.lists(st.text(max_size=40), min_size=1, max_size=4))
def test_any_logged_value_reads_back_as_that_one_value(values: list[str]) -> None:
    line = "request " + " ".join(f"f{index}={logfmt_value(value)}" for index, value in enumerate(values))
    assert "\n" not in line and "\r" not in line
    assert logfmt_fields(line) == {f"f{index}": value for index, value in enumerate(values)}
