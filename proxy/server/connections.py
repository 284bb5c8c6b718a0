"""The connection cap: at most `max_connections` client connections, so idle sockets cannot exhaust the process's files.

Without it, a few more idle sockets than the open-file limit make every `accept()` fail with EMFILE: new clients
(health checks included) are no longer served, and asyncio logs the failure on every attempt. With it, a new
connection at the cap makes room by closing the connection that has been idle longest (no request in progress: a
silent socket, a half-sent head, a keep-alive connection between requests), so `/healthz` and real clients still get
in; only when every connection is busy is the new one closed instead. The operator gets one WARNING line when the cap
is reached and one INFO line when it has cleared, with what was closed in between, never a line per connection.

aiohttp has no hook for this: the cap wraps the `web.Server` that serves the app as the protocol factory of a listener
of its own, and is therefore applied by `serve`, not by aiohttp's test server.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import resource
from typing import Final

from aiohttp import web

from proxy.server.logging import SERVER_LOGGER

log = logging.getLogger(SERVER_LOGGER)

LISTEN_BACKLOG: Final = 128
"""Pending connections the kernel queues, and so the most asyncio accepts in one go before the cap sees them."""

FD_RESERVE: Final = LISTEN_BACKLOG + 64
"""File descriptors kept out of the derived cap: one accept burst, plus the proxy's own files and clients (the
listening socket, logs, encodings, a state store, the summary client's connections)."""

UNLIMITED_FILES: Final = 1 << 20
"""The open-file limit assumed when RLIMIT_NOFILE is unlimited (Linux's default ceiling, `fs.nr_open`)."""

CLEAR_CHECK_SECONDS: Final = 1.0
"""How often, while capped, the cap checks whether the load has gone down."""


def default_max_connections() -> int:
    """The cap derived from this process's soft open-file limit.

    Every client connection may hold one upstream connection too, so half of what is left after `FD_RESERVE`.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    files = UNLIMITED_FILES if soft == resource.RLIM_INFINITY else soft
    return max(1, (files - FD_RESERVE) // 2)


def socket_cap(max_websockets: int, max_connections: int | None) -> int:
    """The most WebSockets tunnelled at once: `max_websockets`, at most half of the connection cap.

    A tunnelled socket is a request in progress for as long as it is open, so the cap never closes it; sockets
    holding every connection would leave none to close for a health check. Half stays for HTTP.
    """
    return min(max_websockets, (max_connections or default_max_connections()) // 2)


def _idle_since(handler: web.RequestHandler) -> float | None:
    """When the connection last finished a request or opened (loop clock); None while busy with a request or closing.

    aiohttp keeps no public record of either: these are the attributes its own keep-alive timer and graceful shutdown
    use (the keep-alive deadline is reset to now + `keepalive_timeout` on connect and after each response).
    """
    if handler.transport is None or handler._request_in_progress:
        return None
    return handler._next_keepalive_close_time - handler.keepalive_timeout


class _Refused(asyncio.Protocol):
    """A connection turned away at the cap: closed as soon as it is made, nothing read or answered."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Close the connection at once."""
        transport.close()


class CappedListener:
    """Listens for clients on `server` (the app's aiohttp `web.Server`) with at most `limit` connections open.

    :param server: The protocol factory to cap: `web.AppRunner.server` after `setup()`.
    :param limit: The most client connections open at once (`max_connections`).
    """

    def __init__(self, server: web.Server, limit: int) -> None:
        self.server = server
        self.limit = limit
        self._listener: asyncio.Server | None = None
        self._capped = False
        self._closed_idle = 0
        self._refused = 0
        self._clear_check: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> None:
        """Start listening on `host`:`port`.

        :param reuse_port: Share the port with other processes listening with `SO_REUSEPORT` (the workers).
        :raises OSError: The address could not be bound.
        """
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(
            self._connection, host, port, backlog=LISTEN_BACKLOG, reuse_port=reuse_port or None
        )

    @property
    def addresses(self) -> list[str]:
        """The `host:port` addresses listened on."""
        sockets = self._listener.sockets if self._listener is not None else ()
        return [f"{sock.getsockname()[0]}:{sock.getsockname()[1]}" for sock in sockets]

    def close(self) -> None:
        """Stop accepting connections; the open ones are left to the runner's graceful shutdown."""
        if self._listener is not None:
            self._listener.close()
        if self._clear_check is not None:
            self._clear_check.cancel()

    def _open(self) -> list[web.RequestHandler]:
        return [handler for handler in self.server.connections if handler.transport is not None]

    def _connection(self) -> asyncio.BaseProtocol:
        """The protocol for a connection just accepted: the app's, after making room at the cap, or `_Refused`.

        asyncio accepts up to `LISTEN_BACKLOG` connections before it asks for their protocols, and they count only
        once connected: a burst can overshoot the cap, and the next connection then closes as many idle ones as it
        takes to be back under it.
        """
        if len(self.server.connections) < self.limit:
            return self.server()
        open_now = self._open()
        excess = len(open_now) + 1 - self.limit
        if excess <= 0:
            return self.server()
        self._reached()
        idle = [(since, handler) for handler in open_now if (since := _idle_since(handler)) is not None]
        for _, handler in heapq.nsmallest(excess, idle, key=lambda pair: pair[0]):
            handler.force_close()
            self._closed_idle += 1
        if len(idle) < excess:
            self._refused += 1
            return _Refused()
        return self.server()

    def _reached(self) -> None:
        if self._capped:
            return
        self._capped = True
        log.warning(
            "connection cap reached: new connections close the longest-idle ones, or are refused when none is idle;"
            " if this is real load, raise the open-file limit (RLIMIT_NOFILE) or max_connections",
            extra={"fields": {"max_connections": self.limit}},
        )
        self._clear_check = asyncio.get_running_loop().call_later(CLEAR_CHECK_SECONDS, self._check_cleared)

    def _check_cleared(self) -> None:
        """While capped: report once the open connections are back under 90% of the cap, else look again later."""
        if len(self._open()) > self.limit * 0.9:
            self._clear_check = asyncio.get_running_loop().call_later(CLEAR_CHECK_SECONDS, self._check_cleared)
            return
        log.info(
            "connection cap cleared",
            extra={
                "fields": {
                    "max_connections": self.limit,
                    "closed_idle": self._closed_idle,
                    "refused": self._refused,
                }
            },
        )
        self._capped = False
        self._closed_idle = 0
        self._refused = 0
        self._clear_check = None
