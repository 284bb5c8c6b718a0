"""The access line says what the client got: a client that closes after a whole answer did not leave early, and the
proxy's own answers (its 502 when the upstream cannot be reached) count the bytes they sent."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest

from proxy.server.logging import ACCESS_LOGGER
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.server.helpers import HeldReport, MakeProxy, raw_request

BODY = orjson.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Say hello."}]})


async def access_line(caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    """The fields of the first access line, once written (after the answer: the handler ends after the client)."""
    while True:
        for record in caplog.records:
            if record.name == ACCESS_LOGGER:
                return dict(getattr(record, "fields", {}))
        await asyncio.sleep(0.01)


async def whole_answer_then_close(port: int) -> bytes:
    """POST as curl does: read the answer to its last byte, then close the connection at once."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(BODY)}\r\n\r\n"
    )
    writer.write(head.encode() + BODY)
    headers = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in headers.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    body = await reader.readexactly(length)
    writer.close()
    return body


async def test_a_client_closing_after_the_whole_answer_did_not_disconnect(
    upstream: OpenAIUpstream, make_proxy: MakeProxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    chat = HeldReport()  # the proxy is still recording the answer's outcome when the client closes
    proxy = await make_proxy(upstream.base_url, chat)
    body = await whole_answer_then_close(proxy.port)
    line = await asyncio.wait_for(access_line(caplog), 10)
    chat.release.set()
    assert orjson.loads(body)["choices"][0]["message"]["content"]
    assert line["status"] == 200 and line["bytes_out"] == len(body)
    assert "client_disconnected" not in line


async def test_the_proxys_own_502_counts_its_bytes(make_proxy: MakeProxy, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    server = await asyncio.start_server(lambda _reader, _writer: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()  # nothing listens there now: connections are refused
    proxy = await make_proxy(f"http://127.0.0.1:{port}")
    status, _, body = await _post(proxy.port)
    line = await asyncio.wait_for(access_line(caplog), 10)
    assert status == 502 and orjson.loads(body)["error"]["code"] == "upstream_unreachable"
    assert line["status"] == 502 and line["bytes_out"] == len(body)


async def _post(port: int) -> tuple[int, bytes, bytes]:
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY
    return await raw_request(port, request)
