"""Reading a client's request body with a pause limit and a minimum rate: a trickling upload cannot hold a handler.

aiohttp bounds the request head (line and header sizes, header count, and, through its keep-alive timer, the time to
send it) but puts no time limit on the body: a client that sends its headers and then a byte a minute would keep a
handler, and for streamed uploads an upstream connection, busy indefinitely. Every read here waits at most
`client_body_timeout` for the next piece, and the body as a whole must keep up `client_body_min_rate` once its first
`client_body_timeout` seconds are over: a byte every few seconds never pauses long enough to trip the first limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Final

from aiohttp import web

from proxy.server.keys import RECORD, SETTINGS

CLIENT_TIMEOUT: Final = "client_timeout"
"""`RequestRecord.error` of a request whose body stalled or trickled."""


class ClientBodyTimeout(Exception):
    """The client paused longer than `client_body_timeout`, or fell below `client_body_min_rate`, sending its body."""


async def client_chunks(request: web.Request, pause_limit: float) -> AsyncIterator[bytes]:
    """Yield the client's body as it arrives, each piece within `pause_limit` seconds of the previous one.

    The body must also arrive at the app's `client_body_min_rate` on average: after N bytes, the time spent waiting
    for them may not exceed `pause_limit` + N / rate seconds. Only time spent waiting on the client counts, not the
    time the caller takes with each piece (forwarding it to a slow upstream, say).

    :raises ClientBodyTimeout: The client stalled or trickled (recorded on the request as `client_timeout`).
    """
    if request.content.is_eof():  # the whole body arrived with the head: nothing to wait for
        if body := request.content.read_nowait():
            yield body
        return
    min_rate = request.app[SETTINGS].client_body_min_rate
    loop = asyncio.get_running_loop()
    received = 0
    waited = 0.0
    while True:
        allowance = min(pause_limit, pause_limit + received / min_rate - waited)
        started = loop.time()
        try:
            async with asyncio.timeout(max(allowance, 0.0)):
                # One received piece at a time: `readany` would first join all pieces buffered by then (a copy of
                # most of a large body, which the caller joins again).
                chunk, http_chunk_end = await request.content.readchunk()
        except TimeoutError:
            request[RECORD].error = CLIENT_TIMEOUT
            raise ClientBodyTimeout from None
        waited += loop.time() - started
        if not chunk:
            if http_chunk_end:  # the end of one piece of a chunked upload, not of the body
                continue
            return
        received += len(chunk)
        yield chunk
