"""WebSocket upgrades, tunnelled: the client's socket and one to the upstream, every frame relayed both ways.

The upgrade is a request like any other: the proxy keys are checked first (`proxy.server.auth`), the path is
checked and mapped onto the upstream's base path, and it gets one access-log line, written when the socket closes
(status 101, the bytes of the messages each way). The upstream's socket is opened first, with the client's
end-to-end headers (the hop-by-hop ones and the handshake's own `Sec-WebSocket-*` stay here; the upstream gets a
handshake of the proxy's) and the subprotocols the client offered; only once the upstream switched protocols is the
client's upgrade accepted, with the subprotocol the upstream chose, and with compression (permessage-deflate) only
if the client offered it and the upstream accepted the proxy's offer of it: compression is negotiated end to end, so
a message never reaches one side inflated from what the other sent compressed (a 64 MiB message of one letter
deflates to 65 KB: relayed whole, the upstream would get 1,000 times what the client sent). An upstream that answers
the upgrade with a status instead gets that status relayed (Codex CLI, told 404 or 426, falls back to HTTP); one that
cannot be reached is answered 502 or 504, as over HTTP.

Then every frame is relayed as it came: text and binary messages, pings and pongs (answered end to end, not by the
proxy), and the closing handshake with its code and reason, whichever side starts it. When one side goes away
without closing, the other is closed with 1001. Limits:

- at most `max_websockets` sockets (at most half of `max_connections`) are open at once, from the upgrade to the
  close; an upgrade past them is answered 503 `too_many_websockets`, so sockets can never hold every connection;
- a message larger than `max_body_bytes` (inflated, when compressed: bounded like a gzip body), from either side,
  closes the socket with 1009 (the upstream gets 1001 when the client sent it);
- a socket on which nothing moved either way (pings included) for `idle_timeout` seconds is closed on both sides
  with 1001, so a vanished peer cannot hold a connection;
- the handshake has `connect_timeout` to connect and `first_byte_timeout` to be answered; a closing handshake
  `WEBSOCKET_CLOSE_WAIT` to be answered.

On a socket to the path of a format with a socket mode (the Responses API), text messages pass through `SocketTurns`.
Sockets still open when the proxy shuts down are closed with 1001.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.http_websocket import WSMessageNoDecodeText
from yarl import URL

from proxy.pipeline.wire import WireFormat
from proxy.server import errors
from proxy.server.headers import upstream_request_headers
from proxy.server.keys import RECORD, ROUTE, SETTINGS
from proxy.server.upstream import WEBSOCKET_CLOSE_WAIT, UpgradeRefused
from proxy.server.websocket_turns import SocketTurns

HANDSHAKE_HEADERS: Final = frozenset(
    {
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-protocol",
        "sec-websocket-extensions",
        "sec-websocket-accept",
    }
)
"""The client's handshake headers: they describe its hop; the upstream's handshake is the proxy's own."""

UpstreamSocket = aiohttp.ClientWebSocketResponse[Literal[False]]
Socket = web.WebSocketResponse | UpstreamSocket

OPEN_TUNNELS: Final[web.AppKey[set[Tunnel]]] = web.AppKey("open_tunnels")
"""The app's open tunnels, closed on shutdown."""


@dataclass
class TunnelSlots:
    """How many sockets may be open at once (`proxy.server.connections.socket_cap`) and how many are."""

    limit: int
    taken: int = 0


TUNNEL_SLOTS: Final[web.AppKey[TunnelSlots]] = web.AppKey("tunnel_slots")
"""The app's socket slots: one taken from the upgrade until the socket closed."""

_RESERVED_CODES: Final = frozenset({1004, 1005, 1006, 1015})
"""Close codes no endpoint may send (RFC 6455 section 7.4.1)."""


def offered_protocols(headers: Iterable[str]) -> list[str]:
    """The subprotocols a client offered (`Sec-WebSocket-Protocol`, possibly repeated), in its order."""
    return [name.strip() for value in headers for name in value.split(",") if name.strip()]


def offers_deflate(headers: Iterable[str]) -> bool:
    """Whether a client's `Sec-WebSocket-Extensions` (possibly repeated) offer permessage-deflate."""
    offers = (offer for value in headers for offer in value.split(","))
    return any(offer.split(";", 1)[0].strip().lower() == "permessage-deflate" for offer in offers)


def sendable(code: int | None) -> int:
    """`code` if an endpoint may send it in a close frame, else 1000 (a peer that closed without a code)."""
    if code is None or code in _RESERVED_CODES or not (1000 <= code <= 1014 or 3000 <= code <= 4999):
        return WSCloseCode.OK
    return code


async def tunnel(request: web.Request, target: URL, wire: WireFormat | None) -> web.StreamResponse:
    """Answer a WebSocket upgrade: open the upstream's socket, then the client's, and relay until either closes.

    :param wire: The wire format compaction reads on this socket (its socket mode), or None for a plain tunnel.
    :raises UpstreamError: The upstream could not be reached or did not answer the handshake in time.
    """
    slots = request.app[TUNNEL_SLOTS]
    if slots.taken >= slots.limit:
        request[RECORD].error = "too_many_websockets"
        return errors.error_response(
            503,
            f"The proxy has its most WebSockets open ({slots.limit}: max_websockets, at most half of"
            " max_connections); retry once one closed, or use HTTP on this path.",
            type_="proxy_error",
            code="too_many_websockets",
        )
    slots.taken += 1
    try:
        return await _tunnel(request, target, wire)
    finally:
        slots.taken -= 1


async def _tunnel(request: web.Request, target: URL, wire: WireFormat | None) -> web.StreamResponse:
    """`tunnel` once a socket slot is taken."""
    settings = request.app[SETTINGS]
    record = request[RECORD]
    limit = settings.max_body_bytes + 1  # aiohttp refuses messages of `max_msg_size` bytes and more
    if not web.WebSocketResponse().can_prepare(request).ok:
        record.error = "bad_upgrade"
        return errors.error_response(
            400,
            "The WebSocket upgrade is malformed: send GET with Connection: Upgrade, Upgrade: websocket,"
            " Sec-WebSocket-Version: 13 and a Sec-WebSocket-Key.",
            type_="invalid_request_error",
            code="invalid_websocket_upgrade",
        )
    headers = upstream_request_headers(request.headers, drop=HANDSHAKE_HEADERS)
    protocols = offered_protocols(request.headers.getall("Sec-WebSocket-Protocol", ()))
    deflate = offers_deflate(request.headers.getall("Sec-WebSocket-Extensions", ()))
    sent = time.perf_counter()
    try:
        async with request[ROUTE].upstream.websocket(target, headers, protocols, limit, compress=deflate) as upstream:
            record.upstream_latency = time.perf_counter() - sent
            record.upstream_status = 101
            client = web.WebSocketResponse(
                autoclose=False,
                autoping=False,
                max_msg_size=limit,
                compress=upstream.compress != 0,
                decode_text=False,
                timeout=WEBSOCKET_CLOSE_WAIT,
                protocols=(upstream.protocol,) if upstream.protocol else (),
            )
            await client.prepare(request)
            record.status = 101
            turns = SocketTurns(request, wire) if wire is not None else None
            await Tunnel(request, client, upstream, turns, request[ROUTE].upstream.idle_timeout).run()
            return client
    except UpgradeRefused as refused:
        record.upstream_status = refused.status
        record.error = "upgrade_refused"
        return errors.error_response(
            refused.status if refused.status >= 400 else 502,
            f"{str(refused).capitalize()} instead of switching protocols; use HTTP on this path.",
            type_="upstream_error",
            code="websocket_upgrade_refused",
        )


@dataclass(frozen=True)
class Ending:
    """How a tunnel ends: the close code and reason each side gets (a side already closed gets nothing)."""

    upstream: tuple[int, str]
    client: tuple[int, str]

    @classmethod
    def both(cls, code: int, reason: str) -> Ending:
        """The same code and reason for both sides."""
        return cls((code, reason), (code, reason))


class Tunnel:
    """Relays frames between the client's socket and the upstream's (see the module docstring).

    Two pumps relay, one per direction; the first to see the socket end stops both, and only then are the sides
    closed, the upstream first: a client that closed gets its answer once the upstream answered, so the closing
    handshake runs end to end, and the client's connection (whose end cancels the handler) is the last to go.

    :param turns: Reads the messages of a Responses socket; None relays every message untouched.
    :param idle: Seconds the socket may stay silent both ways before it is closed.
    """

    def __init__(
        self,
        request: web.Request,
        client: web.WebSocketResponse,
        upstream: UpstreamSocket,
        turns: SocketTurns | None,
        idle: float,
    ) -> None:
        self.request = request
        self.client = client
        self.upstream = upstream
        self.turns = turns
        self.idle = idle
        self._deadline: asyncio.Timeout | None = None
        self._stopped: asyncio.Future[Ending] = asyncio.get_running_loop().create_future()

    async def run(self) -> None:
        """Relay both ways until the socket ends (either side closes or goes, silence, shutdown), then close it."""
        tunnels = self.request.app[OPEN_TUNNELS]
        tunnels.add(self)
        try:
            async with asyncio.timeout(self.idle) as self._deadline:
                ending = await self._relay_until_the_end()
        except TimeoutError:
            self.request[RECORD].error = "idle"
            ending = Ending.both(WSCloseCode.GOING_AWAY, f"nothing was sent either way for {self.idle:g} seconds")
        finally:
            tunnels.discard(self)
        if self.turns is not None:
            await self.turns.settled()
        await self.close(ending)

    async def close(self, ending: Ending) -> None:
        """Close the upstream's side, then the client's (each only if still open)."""
        code, reason = ending.upstream
        await self.upstream.close(code=code, message=reason.encode())
        code, reason = ending.client
        await self.client.close(code=code, message=reason.encode())

    def stop(self, ending: Ending) -> None:
        """End the socket from outside (shutdown): the relay stops, and the tunnel closes both sides with `ending`."""
        if not self._stopped.done():
            self._stopped.set_result(ending)

    async def _relay_until_the_end(self) -> Ending:
        """Relay until a pump sees the socket end, or `stop` is called; return how to close it."""
        pumps = [asyncio.create_task(self._from_client()), asyncio.create_task(self._from_upstream())]
        try:
            done, _ = await asyncio.wait([*pumps, self._stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
        return self._stopped.result() if self._stopped in done else done.pop().result()

    def _moved(self) -> None:
        assert self._deadline is not None
        self._deadline.reschedule(asyncio.get_running_loop().time() + self.idle)

    async def _from_client(self) -> Ending:
        record = self.request[RECORD]
        while True:
            message = await self.client.receive()
            self._moved()
            if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                record.bytes_in += len(message.data)
            if message.type is WSMsgType.TEXT and self.turns is not None:
                turn = await self.turns.outgoing(message.data)
                if turn.client is not None and not await _send(self.client, WSMsgType.TEXT, turn.client):
                    return _CLIENT_GONE
                if turn.upstream is not None and not await _send(self.upstream, WSMsgType.TEXT, turn.upstream):
                    return _UPSTREAM_GONE
                continue
            if message.type in _RELAYED:
                if not await _send(self.upstream, message.type, message.data):
                    return _UPSTREAM_GONE
                continue
            if message.type is WSMsgType.ERROR:
                too_large = getattr(message.data, "code", None) == WSCloseCode.MESSAGE_TOO_BIG
                record.error = "too_large" if too_large else "websocket_error"
            return _ending(message, _CLIENT_GONE)

    async def _from_upstream(self) -> Ending:
        record = self.request[RECORD]
        while True:
            message = await self.upstream.receive()
            self._moved()
            if message.type is WSMsgType.TEXT and self.turns is not None:
                self.turns.incoming(message.data)
            if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                record.bytes_out += len(message.data)
            if message.type in _RELAYED:
                if not await _send(self.client, message.type, message.data):
                    return _CLIENT_GONE
                continue
            if message.type is WSMsgType.ERROR:
                record.error = "broken_stream"
                too_large = getattr(message.data, "code", None) == WSCloseCode.MESSAGE_TOO_BIG
                return _UPSTREAM_TOO_LARGE if too_large else _UPSTREAM_BROKEN
            return _ending(message, _UPSTREAM_GONE)


_RELAYED: Final = frozenset({WSMsgType.TEXT, WSMsgType.BINARY, WSMsgType.PING, WSMsgType.PONG})

_CLIENT_GONE: Final = Ending.both(WSCloseCode.GOING_AWAY, "the client went away")
_UPSTREAM_GONE: Final = Ending.both(WSCloseCode.GOING_AWAY, "the upstream went away")
_UPSTREAM_TOO_LARGE: Final = Ending.both(WSCloseCode.MESSAGE_TOO_BIG, "the upstream sent a message over max_body_bytes")
_UPSTREAM_BROKEN: Final = Ending.both(WSCloseCode.INTERNAL_ERROR, "the upstream broke the WebSocket protocol")


def _ending(message: WSMessageNoDecodeText, gone: Ending) -> Ending:
    """How the socket ends after a message that is not relayed.

    A close frame's code and reason go to both sides; a side that went away or failed (aiohttp closed it) is gone.
    """
    if message.type is WSMsgType.CLOSE:
        return Ending.both(sendable(message.data), message.extra or "")
    return gone


async def _send(sink: Socket, kind: WSMsgType, data: bytes) -> bool:
    """Send one frame; False when the sink's connection is already gone."""
    try:
        if kind is WSMsgType.PING:
            await sink.ping(data)
        elif kind is WSMsgType.PONG:
            await sink.pong(data)
        else:
            await sink.send_frame(data, kind)
    except ConnectionError:
        return False
    return True


async def close_tunnels(app: web.Application) -> None:
    """On shutdown: have every open socket closed on both sides with 1001 (within the shutdown's grace period)."""
    ending = Ending.both(WSCloseCode.GOING_AWAY, "the proxy is shutting down")
    for tunnel in app[OPEN_TUNNELS]:
        tunnel.stop(ending)
