"""The one way out: a pooled HTTP client bound to the configured upstream, with the proxy's timeouts.

Every request goes to the upstream's origin and base path, whatever the client's request line or Host header said.
Responses are read raw (`auto_decompress=False`): compressed bodies reach the client with their Content-Encoding
intact and are never decompressed twice. Cookies are never stored: a shared jar would leak one caller's cookies to
another.

A transport failure is raised as an `UpstreamError` whose text says what failed in plain words (connection refused,
DNS lookup failed, ...) and nothing else: it reaches clients in 502/504 bodies, so it must not name the upstream's
host or port (an internal name tells an outsider about the network) nor quote what a broken upstream sent.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import lru_cache
from typing import Any, Final, Literal

import aiohttp
from aiohttp.http import HttpProcessingError
from multidict import CIMultiDict
from yarl import URL

from proxy.config import Settings
from proxy.server.deadlines import Deadlines
from proxy.server.idle_watch import BETWEEN_READS, IdleTimedOut, IdleWatch
from proxy.server.logging import SERVER_LOGGER
from proxy.server.record import RequestRecord
from proxy.upstream_session import upstream_session

log = logging.getLogger(SERVER_LOGGER)

SKIP_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
"""Headers aiohttp would add on its own: the upstream must see the client's (or none), not aiohttp's."""


class UpstreamError(Exception):
    """The upstream exchange failed in transport (not an HTTP error status, which is relayed as it came).

    Its text is what failed in plain words, fit for a client to read (see the module docstring).
    """

    kind = "unreachable"


class UpstreamUnreachable(UpstreamError):
    """No connection, or the connection broke before the response headers: answered 502."""


class UpstreamTimeout(UpstreamError):
    """Connecting, the first byte or a pause within the body took longer than allowed: answered 504."""

    kind = "timeout"


class UpgradeRefused(Exception):
    """The upstream answered a WebSocket handshake with an HTTP status instead of switching protocols.

    :param status: The upstream's status (404 from an upstream without WebSockets on that path, 401, ...).
    """

    def __init__(self, status: int) -> None:
        super().__init__(f"the upstream answered the WebSocket upgrade with status {status}")
        self.status = status


PIECES_FROM_BYTES: Final = 64 * 1024
"""Bodies from this size are handed to the client in two pieces (see `_in_pieces`)."""
LOOP_SLICE_SECONDS: Final = 0.005
"""Reading an answer already buffered gives the event loop a turn at least this often (see `read_chunk`)."""

RELAY_PIECE_BYTES: Final = 64 * 1024
"""The most bytes of an answer read at once: what one relay step inspects (splits, inflates, edits) before the loop
may turn again, however much the upstream sent ahead while the proxy was busy."""

HEAD_PIECE_BYTES: Final = 16 * 1024

WEBSOCKET_CLOSE_WAIT: Final = 10.0
"""Seconds a WebSocket peer has to answer the closing handshake before its connection is dropped."""

URLS_REMEMBERED: Final = 256
"""Upstream URLs (by raw path and query) an `Upstream` keeps built, the least recently used forgotten first."""

DETAIL_LIMIT = 200
"""Longest operating-system error text logged with a failed connection."""


def _failure(exc: BaseException) -> str:
    """What failed, in plain words: never the exception's own text, which names hosts or quotes upstream bytes."""
    if isinstance(exc, aiohttp.ClientSSLError):
        return "TLS handshake failed"
    if isinstance(exc, aiohttp.ClientConnectorError):
        if isinstance(exc.os_error, socket.gaierror):
            return "DNS lookup failed"
        if isinstance(exc.os_error, ConnectionRefusedError):
            return "connection refused"
        return "could not connect"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the upstream closed the connection"
    if isinstance(exc, ConnectionResetError) or getattr(exc, "errno", None) == errno.ECONNRESET:
        return "connection reset"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "malformed or incomplete response body"
    if isinstance(exc, aiohttp.ClientResponseError):
        return "malformed response"
    if isinstance(exc, ValueError):
        return "the request could not be sent"
    return "connection failed"


def _unreachable(exc: BaseException) -> UpstreamUnreachable:
    """The 502 error for `exc`, after logging it for the operator (an OS error's text only: never upstream bytes).

    A failure of the request body's own source is not the upstream's, and is left to the caller to report (the
    client's upload stalled, say): aiohttp raises it as a connection error caused by the iterator's exception, where
    every other cause is one of its own transport or parsing errors.
    """
    cause = exc.__cause__
    if cause is not None and not isinstance(cause, aiohttp.ClientError | OSError | HttpProcessingError):
        return UpstreamUnreachable("the request body could not be read")
    failure = _failure(exc)
    os_error = exc.os_error if isinstance(exc, aiohttp.ClientConnectorError) else None
    log.warning(
        "upstream request failed before an answer; check that the upstream is up and reachable from here",
        extra={
            "fields": {
                "failure": failure,
                "error": type(exc).__name__,
                "detail": str(os_error)[:DETAIL_LIMIT] if os_error is not None else None,
            }
        },
    )
    return UpstreamUnreachable(failure)


class Upstream:
    """Sends requests to the configured upstream over one `aiohttp.ClientSession` (created and closed by the app).

    :param settings: Supplies the upstream URL and the timeouts.
    :param session: The app's session; None creates one here (see `create_session`).
    """

    def __init__(self, settings: Settings, session: aiohttp.ClientSession) -> None:
        self.base = URL(settings.upstream)
        self.session = session
        self.first_byte_timeout = settings.first_byte_timeout
        self.first_byte = Deadlines(settings.first_byte_timeout)
        """The limit on each request's wait for its answer's headers."""
        self.idle_timeout = settings.idle_timeout
        self._turn_started = time.monotonic()
        self._watches: dict[aiohttp.ClientResponse, IdleWatch] = {}
        """The idle timeout of each answer being read, from its first read to its close (an answer that arrived
        whole with its head is never waited for, and needs none)."""
        self._url_for = lru_cache(maxsize=URLS_REMEMBERED)(self._build_url)
        self.unreachable: str | None = None
        """Why the last request could not connect to the upstream (connection refused, DNS lookup failed, ...), or
        None once one did: `/readyz` reports it."""

    @staticmethod
    def create_session(settings: Settings) -> aiohttp.ClientSession:
        """Return the pooled client session the app keeps for its lifetime, trusting `upstream_ca_bundle` too."""
        return upstream_session(settings, pool_limit=0, skip_auto_headers=SKIP_AUTO_HEADERS)

    def url_for(self, raw_path: str, raw_query: str) -> URL:
        """Return the upstream URL for an already-validated raw path and raw query: base path + path + query.

        The URLs of the paths most requests take are built once (`URLS_REMEMBERED`): the same `URL` object each time
        also keeps what the client works out from it (host, port, origin), which yarl caches on the object.
        """
        return self._url_for(raw_path, raw_query)

    def _build_url(self, raw_path: str, raw_query: str) -> URL:
        base_path = self.base.raw_path.rstrip("/")
        return URL.build(
            scheme=self.base.scheme,
            host=self.base.raw_host or "",
            port=self.base.explicit_port,
            path=base_path + raw_path,
            query_string=raw_query,
            encoded=True,
        )

    def request(
        self,
        method: str,
        url: URL,
        headers: CIMultiDict[str],
        data: Any = None,
        *,
        record: RequestRecord | None = None,
    ) -> Exchange:
        """Send one request; `async with` it for the response once its headers arrived, closed on exit.

        :param record: The client request's record: the upstream's latency to the answer's headers and its status are
            written on it (the one place they are taken, a retry's overwriting the first exchange's).
        :raises UpstreamUnreachable: The upstream could not be connected to or broke off before answering.
        :raises UpstreamTimeout: Connecting or the response headers took too long.
        """
        return Exchange(self, method, url, headers, data, record=record)

    def failure(self, exc: BaseException) -> UpstreamError | None:
        """The `UpstreamError` a transport failure of a request is raised as (noted when connecting failed).

        None for anything else (a cancellation, a bug), which is raised as it is.
        """
        if isinstance(exc, aiohttp.ServerTimeoutError):  # the session's only socket timeout is `sock_connect`
            return UpstreamTimeout("timed out connecting")
        if isinstance(exc, TimeoutError):
            return self.no_response()
        if not isinstance(exc, aiohttp.ClientError | OSError | ValueError):
            return None
        error = _unreachable(exc)
        if isinstance(exc, aiohttp.ClientConnectorError):
            self.unreachable = str(error)
        return error

    def no_response(self) -> UpstreamTimeout:
        """The error of a request whose answer's headers did not come within `first_byte_timeout`."""
        return UpstreamTimeout(f"no response within {self.first_byte_timeout:g} seconds")

    def _done(self, response: aiohttp.ClientResponse) -> None:
        """Stop watching the response and let its connection go."""
        watch = self._watches.pop(response, None)
        if watch is not None:
            watch.close()
        # Closing (not releasing) drops a half-read connection at once: a client that went away mid-stream
        # stops the upstream's generation instead of the proxy draining it.
        if response.content.at_eof():
            response.release()
        else:
            response.close()

    @asynccontextmanager
    async def websocket(
        self, url: URL, headers: CIMultiDict[str], protocols: list[str], max_msg_size: int, *, compress: bool = False
    ) -> AsyncIterator[aiohttp.ClientWebSocketResponse[Literal[False]]]:
        """Open a WebSocket to `url` and yield it once the upstream switched protocols; it is closed on exit.

        Pings, pongs and close frames are handed to the caller (no automatic answers), so a tunnel relays them
        end to end; text stays bytes, relayed without decoding.

        :param protocols: The subprotocols the client offered, in its order.
        :param max_msg_size: The largest message accepted from the upstream; a larger one closes it with 1009.
        :param compress: Offer permessage-deflate (RFC 7692); the socket's `compress` says whether it was accepted.
        :raises UpgradeRefused: The upstream answered with an HTTP status instead.
        :raises UpstreamUnreachable: The upstream could not be connected to or broke off before answering.
        :raises UpstreamTimeout: Connecting or the handshake's answer took too long.
        """
        try:
            async with asyncio.timeout(self.first_byte_timeout):
                socket = await self.session.ws_connect(
                    url,
                    headers=headers,
                    protocols=protocols,
                    autoclose=False,
                    autoping=False,
                    max_msg_size=max_msg_size,
                    compress=15 if compress else 0,
                    decode_text=False,
                    timeout=aiohttp.ClientWSTimeout(ws_close=WEBSOCKET_CLOSE_WAIT),
                )
        except aiohttp.WSServerHandshakeError as exc:
            raise UpgradeRefused(exc.status) from exc
        except aiohttp.ServerTimeoutError as exc:
            raise UpstreamTimeout("timed out connecting") from exc
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"no answer to the WebSocket upgrade within {self.first_byte_timeout:g} seconds"
            ) from exc
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise _unreachable(exc) from exc
        try:
            yield socket
        finally:
            # Reached unclosed only when the handler was cancelled (its client went away) or failed.
            await socket.close(code=aiohttp.WSCloseCode.GOING_AWAY)

    async def read_chunk(self, response: aiohttp.ClientResponse) -> bytes:
        """Return the next piece of the response body as it arrives (b"" at the end), within `idle_timeout`.

        One frame between the relay and the body's stream: the idle watch is told of the read by its deadline.

        :raises UpstreamTimeout: The upstream stayed silent too long.
        :raises UpstreamUnreachable: The connection broke mid-body.
        """
        watch = self._watches.get(response)
        if watch is None:  # made at the first read: an answer that arrived whole with its head never needs one
            watch = self._watches[response] = IdleWatch(response.content, self.idle_timeout)
        now = time.monotonic()
        if now - self._turn_started >= LOOP_SLICE_SECONDS:
            now = await self._share_the_loop()
        watch.deadline = now + self.idle_timeout
        try:
            return await response.content.read(RELAY_PIECE_BYTES)
        except IdleTimedOut as exc:
            raise UpstreamTimeout(f"the response paused for more than {self.idle_timeout:g} seconds") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamUnreachable(_failure(exc)) from exc
        finally:
            watch.deadline = BETWEEN_READS

    async def _share_the_loop(self) -> float:
        """Give the event loop a turn: reading has held it `LOOP_SLICE_SECONDS` (checked by `read_chunk`); the time.

        A read of data already buffered returns without suspending, so a relay of an upstream that sends faster than
        the client reads (a flood of small events) would otherwise hold the loop, `/healthz` and every other request
        with it, until the buffer ran dry. The check is made inline, so a read pays a clock reading, not a call.
        """
        await asyncio.sleep(0)
        self._turn_started = time.monotonic()
        return self._turn_started


class Exchange(AbstractAsyncContextManager[aiohttp.ClientResponse]):
    """One upstream exchange (`Upstream.request`): the response on entry, closed on exit.

    A class rather than a generator-based context manager: it is entered once per request, and a generator and its
    wrapper cost more than these two calls.
    """

    __slots__ = ("_data", "_headers", "_method", "_record", "_response", "_upstream", "_url")

    def __init__(
        self,
        upstream: Upstream,
        method: str,
        url: URL,
        headers: CIMultiDict[str],
        data: Any,
        *,
        record: RequestRecord | None,
    ) -> None:
        self._upstream = upstream
        self._method = method
        self._url = url
        self._headers = headers
        self._data = data
        self._record = record
        self._response: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> aiohttp.ClientResponse:
        """Send the request; the response once its headers arrived, its body's pauses watched once it is read."""
        upstream, data, record = self._upstream, self._data, self._record
        if isinstance(data, bytes) and len(data) >= PIECES_FROM_BYTES:
            data = _in_pieces(data)
        sent = time.perf_counter()
        task = upstream.first_byte.begin()
        try:
            response = await upstream.session.request(
                self._method, self._url, headers=self._headers, data=data, allow_redirects=False, compress=None
            )
        except BaseException as exc:
            if upstream.first_byte.end(task, cancelled=isinstance(exc, asyncio.CancelledError)):
                raise upstream.no_response() from None
            failure = upstream.failure(exc)
            if failure is None:
                raise
            raise failure from exc
        upstream.first_byte.end(task, cancelled=False)
        upstream.unreachable = None
        if record is not None:
            record.upstream_latency = time.perf_counter() - sent
            record.upstream_status = response.status
        self._response = response
        return response

    async def __aexit__(self, *exc_info: object) -> None:
        """Close the response (see `Upstream._done`)."""
        if self._response is not None:
            self._upstream._done(self._response)


async def _in_pieces(body: bytes) -> AsyncIterator[memoryview]:
    """`body` as a short first piece and the rest, both views of it: nothing is copied.

    Given the whole body at once, the client joins it to the request head into one new buffer before writing, a copy
    of the body (3.3 MB for a very large conversation); given in pieces, only the first is joined to the head. The
    request's Content-Length (set by the caller) keeps the body from being sent chunked.
    """
    view = memoryview(body)
    yield view[:HEAD_PIECE_BYTES]
    yield view[HEAD_PIECE_BYTES:]
