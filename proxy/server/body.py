"""Reading a client's request body with a pause limit, so a trickling upload cannot hold a handler open forever.

aiohttp bounds the request head (line and header sizes, header count) but puts no time limit on the body: a client
that sends its headers and then a byte a minute would keep a handler, and for streamed uploads an upstream
connection, busy indefinitely. Every read here waits at most `client_body_timeout` for the next piece.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Final

from aiohttp import web

from proxy.server.keys import RECORD

CLIENT_TIMEOUT: Final = "client_timeout"
"""`RequestRecord.error` of a request whose body stalled."""


class ClientBodyTimeout(Exception):
    """The client paused longer than `client_body_timeout` while sending its body."""


async def client_chunks(request: web.Request, pause_limit: float) -> AsyncIterator[bytes]:
    """Yield the client's body as it arrives, each piece within `pause_limit` seconds of the previous one.

    :raises ClientBodyTimeout: The client stalled (recorded on the request as `client_timeout`).
    """
    while True:
        try:
            async with asyncio.timeout(pause_limit):
                chunk = await request.content.readany()
        except TimeoutError:
            request[RECORD].error = CLIENT_TIMEOUT
            raise ClientBodyTimeout from None
        if not chunk:
            return
        yield chunk
