"""The server's per-request shortcuts say exactly what the general code they replaced said.

Each shortcut (the access line built in one pass, headers filtered against a precomputed set, the conversation id
looked up only when a header may name one, a remembered route kind) is checked against a plain statement of the rule
on generated inputs.
"""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp.test_utils import make_mocked_request
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from proxy.config import Settings
from proxy.formats import format_of
from proxy.pipeline.cache_misses import Misses
from proxy.pipeline.caller import conversation_of
from proxy.server.accounting import MAX_CONVERSATION_ID, _conversation_id
from proxy.server.headers import (
    HOP_BY_HOP,
    REQUEST_ONLY_DROPS,
    client_response_headers,
    connection_listed,
    upstream_request_headers,
)
from proxy.server.record import RequestRecord
from proxy.server.routes import route_kind
from proxy.server.upstream import Upstream
from tests.support.examples import examples

maybe_text = st.none() | st.text(max_size=12)
maybe_count = st.none() | st.integers(min_value=0, max_value=10**7)


def general_access_fields(record: RequestRecord, path: str, elapsed: float) -> dict[str, Any]:
    """The access line's fields as first written: every field, then those that are None left out."""
    fields = {
        "method": record.method,
        "path": path,
        "route": record.route,
        "upstream": record.upstream,
        "status": record.status,
        "upstream_status": record.upstream_status,
        "latency_ms": round(elapsed * 1000, 1),
        "upstream_latency_ms": None if record.upstream_latency is None else round(record.upstream_latency * 1000, 1),
        "bytes_in": record.bytes_in,
        "bytes_out": record.bytes_out,
        "conversation_id": record.conversation_id,
        "model": record.model,
        "compaction": record.compaction,
        "tokens_before": record.tokens_before,
        "tokens_after": record.tokens_after,
        "conversation_hash": record.conversation_hash,
        "cache_misses": None if record.cache_misses is None else record.cache_misses.shown() or "none",
        "retried": record.retried or None,
        "stripped_usage": record.stripped_usage or None,
        "fail_open": ",".join(record.fail_open) or None,
        "client_disconnected": record.client_disconnected or None,
        "error": record.error,
    }
    return {key: value for key, value in fields.items() if value is not None}


@st.composite
def records(draw: st.DrawFn) -> RequestRecord:
    """A request record with any mix of its fields known."""
    record = RequestRecord(draw(st.sampled_from(["GET", "POST"])), draw(st.text(max_size=8)), draw(maybe_text))
    record.upstream = draw(maybe_text)
    record.status = draw(st.none() | st.integers(100, 599))
    record.upstream_status = draw(st.none() | st.integers(100, 599))
    record.upstream_latency = draw(st.none() | st.floats(0, 1000))
    record.bytes_in, record.bytes_out = draw(st.integers(0, 10**9)), draw(st.integers(0, 10**9))
    record.model, record.compaction, record.conversation_hash = draw(maybe_text), draw(maybe_text), draw(maybe_text)
    record.tokens_before, record.tokens_after = draw(maybe_count), draw(maybe_count)
    if draw(st.booleans()):
        record.cache_misses = Misses(new=draw(st.integers(0, 9)), compaction=draw(st.integers(0, 9)))
    record.retried, record.stripped_usage = draw(st.booleans()), draw(st.booleans())
    record.fail_open = draw(st.lists(st.sampled_from(["prepare", "complete", "inspect"]), max_size=3))
    record.client_disconnected = draw(st.booleans())
    record.error = draw(maybe_text)
    return record


@settings(max_examples=examples(300))
@given(records(), st.text(max_size=20), st.floats(0, 10_000))
def test_the_access_line_has_the_fields_of_the_general_rule_in_its_order(
    record: RequestRecord, path: str, elapsed: float
) -> None:
    fast = record.access_fields(path, elapsed)
    general = general_access_fields(record, path, elapsed)
    assert list(fast.items()) == list(general.items())


header_names = st.sampled_from(
    [
        "Host",
        "Content-Type",
        "Content-Length",
        "Authorization",
        "Connection",
        "Keep-Alive",
        "TE",
        "Upgrade",
        "Proxy-Authorization",
        "proxy-anything",
        "X-Compaction",
        "x-context-window",
        "X-Proxy-Key",
        "Expect",
        "Content-Encoding",
        "X-Custom",
        "x-conversation-id",
        "X-Claude-Code-Session-Id",
        "connection",
        "CONTENT-LENGTH",
        "PROXY-Connection",
        "x-custom",
    ]
)
header_values = st.sampled_from(["a", "keep-alive", "x-custom, Content-Type", "close", " X-CUSTOM ,", "gzip"])


def general_upstream_headers(headers: CIMultiDict[str], drop: tuple[str, ...]) -> CIMultiDict[str]:
    """The request headers sent upstream, by the rule: no hop-by-hop, no `Proxy-*`, nothing the proxy consumes."""
    dropped = HOP_BY_HOP | REQUEST_ONLY_DROPS | {name.lower() for name in drop} | connection_listed(headers)
    return CIMultiDict(
        (name, value)
        for name, value in headers.items()
        if name.lower() not in dropped and not name.lower().startswith("proxy-")
    )


@settings(max_examples=examples(300))
@given(
    st.lists(st.tuples(header_names, header_values), max_size=12),
    st.lists(st.sampled_from(["Content-Encoding", "x-custom", "CONTENT-TYPE"]), max_size=2),
)
def test_request_headers_are_filtered_as_the_rule_says(pairs: list[tuple[str, str]], drop: list[str]) -> None:
    headers = CIMultiDict(pairs)
    fast = upstream_request_headers(headers, drop=drop)
    assert list(fast.items()) == list(general_upstream_headers(headers, tuple(drop)).items())


@settings(max_examples=examples(300))
@given(st.lists(st.tuples(header_names, header_values), max_size=12), st.booleans())
def test_response_headers_are_filtered_as_the_rule_says(pairs: list[tuple[str, str]], drop_length: bool) -> None:
    headers = CIMultiDict(pairs)
    dropped = HOP_BY_HOP | connection_listed(headers) | ({"content-length"} if drop_length else set())
    general = [(name, value) for name, value in pairs if name.lower() not in dropped and not _proxy_header(name)]
    fast = client_response_headers(headers, drop_length=drop_length)
    assert list(fast.items()) == general


def _proxy_header(name: str) -> bool:
    return name.lower().startswith("proxy-")


@settings(max_examples=examples(300))
@given(
    st.lists(st.tuples(header_names, st.text(max_size=6)), max_size=8),
    st.sampled_from(["/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/embeddings"]),
)
def test_the_conversation_id_is_the_one_conversation_of_finds(pairs: list[tuple[str, str]], path: str) -> None:
    settings_ = Settings(upstream="http://127.0.0.1:1")
    request = make_mocked_request("POST", path, headers=CIMultiDict(pairs))
    value = conversation_of(request.headers, settings_, format_of("POST", path))
    expected = None if value is None else "".join(c for c in value[:MAX_CONVERSATION_ID] if c.isprintable())
    assert _conversation_id(request, settings_) == expected


@settings(max_examples=examples(200))
@given(
    st.sampled_from(["GET", "POST", "PUT"]),
    st.lists(st.sampled_from(["v1", "embeddings", "models", "responses", "chat", "completions", "healthz", "x"])),
)
def test_a_remembered_route_kind_is_the_one_worked_out_again(method: str, segments: list[str]) -> None:
    path = "/" + "/".join(segments)
    first = route_kind(method, path)
    assert route_kind.__wrapped__(method, path) == first == route_kind(method, path)


@settings(max_examples=examples(100))
@given(
    st.sampled_from(["http://127.0.0.1:1", "http://127.0.0.1:1/base/", "https://upstream.example:8443/v"]),
    st.lists(
        st.tuples(st.sampled_from(["/v1/chat/completions", "/v1/models", "/a%20b", "/"]), st.sampled_from(["", "a=1"])),
        max_size=6,
    ),
)
async def test_a_remembered_upstream_url_is_the_one_built_anew(base: str, requests: list[tuple[str, str]]) -> None:
    async with aiohttp.ClientSession() as session:
        upstream = Upstream(Settings(upstream=base), session)
        for raw_path, raw_query in requests:
            url = upstream.url_for(raw_path, raw_query)
            assert url == upstream._build_url(raw_path, raw_query)
            assert upstream.url_for(raw_path, raw_query) is url
