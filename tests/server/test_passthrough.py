"""Everything that is not a chat completion crosses the proxy unchanged, both ways, and only to the upstream."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import os
from collections.abc import AsyncIterator

import aiohttp
import pytest
from multidict import CIMultiDict

from proxy.server.headers import client_response_headers, upstream_request_headers
from proxy.simulator.openai_upstream import OpenAIUpstream, deterministic_bytes
from tests.server.helpers import MakeProxy, Proxy, Recording, raw_request

END_TO_END = ("Content-Type", "Content-Length", "Content-Encoding", "X-Body-Sha256")


async def fetch(
    http: aiohttp.ClientSession, method: str, url: str, **kwargs: object
) -> tuple[int, CIMultiDict[str], bytes]:
    async with http.request(method, url, **kwargs) as response:  # type: ignore[arg-type]
        return response.status, CIMultiDict(response.headers), await response.read()


async def test_models_list_is_byte_identical(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession
) -> None:
    direct = await fetch(http, "GET", upstream.base_url + "/v1/models")
    via = await fetch(http, "GET", proxy.url + "/v1/models", headers={"Authorization": "Bearer sk-a"})
    assert via[0] == direct[0] == 200
    assert via[2] == direct[2]
    assert via[1]["Content-Type"] == direct[1]["Content-Type"]
    assert upstream.requests[-1].headers["Authorization"] == "Bearer sk-a"


async def test_embeddings_are_byte_identical_both_ways(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession
) -> None:
    body = json.dumps({"model": "text-embedding-3-small", "input": ["a", "b é"], "dimensions": 8}).encode()
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-a"}
    direct = await fetch(http, "POST", upstream.base_url + "/v1/embeddings", data=body, headers=headers)
    via = await fetch(http, "POST", proxy.url + "/v1/embeddings", data=body, headers=headers)
    assert via[0] == direct[0] == 200
    assert via[2] == direct[2]
    assert upstream.requests[-1].body == upstream.requests[-2].body == body


@pytest.mark.parametrize("gzip_reply", [False, True])
async def test_echo_relays_raw_bytes_with_content_encoding(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession, gzip_reply: bool
) -> None:
    query = "size=300000&chunked=1" + ("&gzip=1" if gzip_reply else "")
    status, headers, body = await fetch(http, "GET", f"{proxy.url}/echo/blob?{query}")
    assert status == 200
    assert hashlib.sha256(body).hexdigest() == headers["X-Body-Sha256"]
    if gzip_reply:
        assert headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(body) == deterministic_bytes(300000)
    else:
        assert "Content-Encoding" not in headers
        assert body == deterministic_bytes(300000)


async def test_echo_description_gzip_and_query_are_relayed(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession
) -> None:
    status, headers, body = await fetch(http, "PUT", f"{proxy.url}/echo/a%2Fb/c?x=1&y=%20z&gzip=1", data=b"payload")
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    description = json.loads(gzip.decompress(body))
    assert description["method"] == "PUT"
    assert description["raw_path"] == "/echo/a%2Fb/c"
    assert description["query_string"] == "x=1&y= z&gzip=1"
    assert description["body_sha256"] == hashlib.sha256(b"payload").hexdigest()


async def test_compressed_request_body_is_forwarded_untouched(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession
) -> None:
    packed = gzip.compress(b'{"hello": "world"}' * 100, mtime=0)
    status, _, _ = await fetch(http, "POST", proxy.url + "/echo/in", data=packed, headers={"Content-Encoding": "gzip"})
    assert status == 200
    received = upstream.requests[-1]
    # The fake (an aiohttp server) inflates what it receives; the proxy must have sent the compressed bytes.
    assert received.headers["Content-Encoding"] == "gzip"
    assert received.headers["Content-Length"] == str(len(packed))
    assert received.body == gzip.decompress(packed)


async def test_compressed_chat_request_is_decompressed_for_compaction(
    upstream: OpenAIUpstream, make_proxy: MakeProxy, http: aiohttp.ClientSession
) -> None:
    chat = Recording()
    proxy = await make_proxy(upstream.base_url, chat)
    body = b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}'
    packed = gzip.compress(body, mtime=0)
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    status, _, _ = await fetch(http, "POST", proxy.url + "/v1/chat/completions", data=packed, headers=headers)
    assert status == 200
    assert [chat.body for chat in chat.prepared] == [body]
    received = upstream.requests[-1]
    assert "Content-Encoding" not in received.headers
    assert received.headers["Content-Length"] == str(len(body))
    assert received.body == body


async def test_hop_by_hop_headers_are_dropped_and_authorization_kept(upstream: OpenAIUpstream, proxy: Proxy) -> None:
    request = (
        b"GET /echo/h HTTP/1.1\r\n"
        b"Host: somewhere-else.example\r\n"
        b"Authorization: Bearer sk-secret\r\n"
        b"api-key: azure-key\r\n"
        b"Connection: close, X-Per-Hop\r\n"
        b"X-Per-Hop: 1\r\n"
        b"Keep-Alive: timeout=5\r\n"
        b"TE: trailers\r\n"
        b"Trailer: X-Checksum\r\n"
        b"Proxy-Authorization: Basic abc\r\n"
        b"Proxy-Connection: keep-alive\r\n"
        b"X-End-To-End: kept\r\n"
        b"\r\n"
    )
    status, _, body = await raw_request(proxy.port, request)
    assert status == 200
    received = {name.lower(): value for name, value in json.loads(body)["headers"]}
    assert received["authorization"] == "Bearer sk-secret"
    assert received["api-key"] == "azure-key"
    assert received["x-end-to-end"] == "kept"
    assert received["host"] == f"127.0.0.1:{upstream.port}"
    for dropped in ("x-per-hop", "keep-alive", "te", "trailer", "proxy-authorization", "proxy-connection"):
        assert dropped not in received
    assert received.get("connection", "keep-alive") != "close, X-Per-Hop"
    assert "user-agent" not in received  # aiohttp added nothing of its own


def test_response_hop_by_hop_filter() -> None:
    upstream_headers = CIMultiDict(
        [
            ("Content-Type", "application/json"),
            ("Connection", "keep-alive, X-Hop"),
            ("X-Hop", "1"),
            ("Keep-Alive", "timeout=5"),
            ("Transfer-Encoding", "chunked"),
            ("Upgrade", "h2c"),
            ("Proxy-Authenticate", "Basic"),
            ("Set-Cookie", "a=1"),
            ("Set-Cookie", "b=2"),
            ("Content-Length", "12"),
            ("x-ratelimit-remaining-requests", "9"),
        ]
    )
    kept = client_response_headers(upstream_headers, extra={"X-Compaction": "none"})
    assert sorted(name for name, _ in kept.items()) == sorted(
        ["Content-Type", "Set-Cookie", "Set-Cookie", "Content-Length", "x-ratelimit-remaining-requests", "X-Compaction"]
    )
    assert kept.getall("Set-Cookie") == ["a=1", "b=2"]
    assert "Content-Length" not in client_response_headers(upstream_headers, drop_length=True)
    request_headers = CIMultiDict([("Host", "x"), ("Expect", "100-continue"), ("Content-Length", "3"), ("A", "b")])
    assert dict(upstream_request_headers(request_headers, body_length=10)) == {"A": "b", "Content-Length": "10"}


async def test_upstream_errors_are_relayed_intact(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession
) -> None:
    limits = {"retry-after": "7", "x-ratelimit-remaining-requests": "0", "x-request-id": "req_1", "openai-version": "v"}
    for path in ("/v1/embeddings", "/v1/chat/completions"):
        upstream.fail_next(429, headers=limits)
        status, headers, body = await fetch(http, "POST", proxy.url + path, data=b"{}")
        assert status == 429
        assert json.loads(body)["error"]["code"] == "rate_limit_exceeded"
        for name, value in limits.items():
            assert headers[name] == value
    upstream.fail_next(503, body=b"not json at all")
    status, _, body = await fetch(http, "GET", proxy.url + "/v1/models")
    assert (status, body) == (503, b"not json at all")


async def test_unreachable_upstream_is_a_502_openai_error(make_proxy: MakeProxy, http: aiohttp.ClientSession) -> None:
    with socket_bound_but_closed() as port:
        proxy = await make_proxy(f"http://127.0.0.1:{port}")
        for path in ("/v1/models", "/v1/chat/completions"):
            status, _, body = await fetch(http, "POST", proxy.url + path, data=b'{"model": "m", "messages": []}')
            assert status == 502
            error = json.loads(body)["error"]
            assert error["type"] == "upstream_error" and error["code"] == "upstream_unreachable"


class socket_bound_but_closed:
    """A loopback port that nothing listens on (bound without listen, so nobody else gets it meanwhile)."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        port: int = self.sock.getsockname()[1]
        return port

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


@pytest.fixture
async def silent_upstream() -> AsyncIterator[str]:
    """An upstream that accepts connections and never answers."""
    release = asyncio.Event()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    release.set()
    server.close()
    await server.wait_closed()


async def test_upstream_timeout_is_a_504_openai_error(
    silent_upstream: str, make_proxy: MakeProxy, http: aiohttp.ClientSession
) -> None:
    proxy = await make_proxy(silent_upstream, first_byte_timeout=0.2)
    for path in ("/v1/models", "/v1/chat/completions"):
        status, _, body = await fetch(http, "POST", proxy.url + path, data=b'{"model": "m", "messages": []}')
        assert status == 504
        assert json.loads(body)["error"]["code"] == "upstream_timeout"


@pytest.mark.parametrize(
    "target",
    [b"/v1/../secret", b"/v1/%2e%2e/secret", b"/v1/%2E%2E%2fsecret", b"/echo/..\\secret", b"/./v1/models"],
)
async def test_path_traversal_is_refused(upstream: OpenAIUpstream, proxy: Proxy, target: bytes) -> None:
    status, _, body = await raw_request(
        proxy.port, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert status == 400
    assert json.loads(body)["error"]["code"] == "invalid_path"
    assert upstream.requests == []


async def test_asterisk_form_is_refused(upstream: OpenAIUpstream, proxy: Proxy) -> None:
    status, _, _ = await raw_request(proxy.port, b"OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status in (400, 404)  # aiohttp answers it; never forwarded
    assert upstream.requests == []


async def test_request_line_and_host_cannot_redirect_the_proxy(upstream: OpenAIUpstream, proxy: Proxy) -> None:
    for request, path in (
        (
            b"GET http://evil.example/echo/abs?q=1 HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
            "/echo/abs",
        ),
        (
            b"GET //evil.example/echo/abs?q=1 HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
            "/evil.example/echo/abs",
        ),
    ):
        await raw_request(proxy.port, request)
        received = upstream.requests[-1]
        assert (received.path, received.query_string) == (path, "q=1")
        assert received.headers["Host"] == f"127.0.0.1:{upstream.port}"


async def test_base_path_of_the_upstream_is_prepended(
    upstream: OpenAIUpstream, make_proxy: MakeProxy, http: aiohttp.ClientSession
) -> None:
    proxy = await make_proxy(upstream.base_url + "/echo/base/")
    status, _, body = await fetch(http, "GET", proxy.url + "/v1/models?a=b")
    assert status == 200
    assert json.loads(body)["raw_path"] == "/echo/base/v1/models"


async def test_bodies_above_one_mib_are_accepted(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession
) -> None:
    payload = os.urandom(5_000_000)
    status, _, body = await fetch(http, "POST", proxy.url + "/echo/big", data=payload)
    assert status == 200
    assert json.loads(body)["body_sha256"] == hashlib.sha256(payload).hexdigest()

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(payload), 1 << 20):
            yield payload[start : start + (1 << 20)]

    status, _, body = await fetch(http, "POST", proxy.url + "/echo/big-chunked", data=chunks())
    assert status == 200
    assert json.loads(body)["body_length"] == len(payload)


async def test_bodies_above_the_limit_get_413(
    upstream: OpenAIUpstream, make_proxy: MakeProxy, http: aiohttp.ClientSession
) -> None:
    proxy = await make_proxy(upstream.base_url, max_body_bytes=1 << 20)
    payload = b"x" * ((1 << 20) + 1)

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(payload), 65536):
            yield payload[start : start + 65536]

    for path in ("/echo/big", "/v1/chat/completions"):
        for data in (payload, chunks()):
            status, _, body = await fetch(http, "POST", proxy.url + path, data=data)
            assert status == 413, (path, data)
            error = json.loads(body)["error"]
            assert error["type"] == "invalid_request_error" and error["code"] == "request_too_large"
    assert all(request.path != "/v1/chat/completions" for request in upstream.requests)
