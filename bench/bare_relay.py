"""The floor: a bare aiohttp relay that parses nothing, to show how close the proxy comes to the limit.

Forwards every request's method, path, query, headers (minus hop-by-hop and Host) and body to the upstream,
streaming the body both ways, over one pooled `aiohttp.ClientSession`; relays status, headers and body as they
arrive. No JSON, no state, no metrics, no logging: whatever the proxy costs beyond this is the proxy's own work.

    python -m bench.bare_relay --port 0 --upstream http://127.0.0.1:PORT [--event-loop asyncio|uvloop]

`--event-loop` (default `auto`, as the proxy's) puts it on the same loop as the proxy it is compared with.

prints its base URL on stdout once it listens, and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator, Sequence

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from bench.serving import serve_until_signalled
from proxy.config.kinds import EventLoop
from proxy.server.event_loop import loop_factory

SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", URL)

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "proxy-connection",
        "host",
    }
)


def end_to_end(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """The headers minus hop-by-hop ones (and Host, which becomes the upstream's)."""
    return CIMultiDict((name, value) for name, value in headers.items() if name.lower() not in HOP_BY_HOP)


async def _body(request: web.Request) -> AsyncIterator[bytes]:
    async for chunk in request.content.iter_any():
        yield chunk


async def relay(request: web.Request) -> web.StreamResponse:
    """Forward the request as it came and stream the answer back."""
    base = request.app[UPSTREAM]
    target = base.with_path(request.rel_url.raw_path, encoded=True).with_query(request.rel_url.raw_query_string)
    data = _body(request) if request.body_exists else None
    async with request.app[SESSION].request(
        request.method, target, headers=end_to_end(request.headers), data=data, allow_redirects=False
    ) as response:
        out = web.StreamResponse(status=response.status, reason=response.reason, headers=end_to_end(response.headers))
        await out.prepare(request)
        while chunk := await response.content.readany():
            await out.write(chunk)
        await out.write_eof()
        return out


async def _session(app: web.Application) -> AsyncIterator[None]:
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        auto_decompress=False,
        skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
        cookie_jar=aiohttp.DummyCookieJar(),
        timeout=aiohttp.ClientTimeout(total=None),
    )
    app[SESSION] = session
    try:
        yield
    finally:
        await session.close()


def make_app(upstream: str) -> web.Application:
    """The relay application in front of `upstream`."""
    app = web.Application(client_max_size=1 << 30, handler_args={"auto_decompress": False})
    app[UPSTREAM] = URL(upstream)
    app.cleanup_ctx.append(_session)
    app.router.add_route("*", "/{tail:.*}", relay)
    return app


async def serve(host: str, port: int, upstream: str) -> None:
    """Listen, print the base URL, and serve until SIGTERM/SIGINT."""
    await serve_until_signalled(make_app(upstream), host, port)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the flags and serve."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")
    parser.add_argument("--upstream", required=True, help="base URL to forward to")
    parser.add_argument("--event-loop", choices=[loop.value for loop in EventLoop], default=EventLoop.AUTO.value)
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=loop_factory(args.event_loop)[1]) as runner:
        runner.run(serve(args.host, args.port, args.upstream))
    return 0


if __name__ == "__main__":
    sys.exit(main())
