"""The app factory and its lifecycle: the route table's upstream clients for the app's lifetime, readiness, routes."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from proxy.config import Settings
from proxy.pipeline.exchange import Compaction, PassThrough
from proxy.server import conversations, dashboard, health
from proxy.server.accounting import accounting
from proxy.server.auth import inbound_auth
from proxy.server.bills import add_prices
from proxy.server.connections import socket_cap
from proxy.server.forwarding import proxy_request
from proxy.server.keys import COMPACTION, METRICS, READINESS, ROUTES, SETTINGS
from proxy.server.logging import CONNECTION_LOGGER, SERVER_LOGGER, ConnectionLogger
from proxy.server.metrics import ProxyMetrics
from proxy.server.pod_metrics import shared_directory
from proxy.server.readiness import Readiness
from proxy.server.route_table import RouteTable
from proxy.server.tracing import exporter
from proxy.server.websocket import OPEN_TUNNELS, TUNNEL_SLOTS, TunnelSlots, close_tunnels

log = logging.getLogger(SERVER_LOGGER)

HANDLER_ARGS: dict[str, Any] = {
    # Request bodies are forwarded as they came: never inflate a gzip-encoded upload.
    "auto_decompress": False,
    # A client that goes away cancels its handler, which closes the upstream response and stops the generation.
    "handler_cancellation": True,
    # The accounting middleware writes the access log (structured, without credentials).
    "access_log": None,
    # A malformed request head is an INFO line, not an ERROR with a traceback.
    "logger": ConnectionLogger(logging.getLogger(CONNECTION_LOGGER)),
}
"""Connection-handler options; set on the app, so they hold however it is run (AppRunner, TestServer, run_app)."""


def handler_args(settings: Settings) -> dict[str, Any]:
    """`HANDLER_ARGS` plus the request-head limits from the settings: sizes, header count and time to send a head.

    aiohttp's keep-alive timer runs from when a connection opens and again from the end of each response, and closes
    the connection if no complete request head has arrived when it fires: that is `client_header_timeout`.
    """
    return {
        **HANDLER_ARGS,
        "keepalive_timeout": settings.client_header_timeout,
        "max_line_size": settings.max_header_bytes,
        "max_field_size": settings.max_header_bytes,
        "max_headers": settings.max_headers,
    }


def create_app(
    settings: Settings,
    compaction: Compaction | None = None,
    *,
    registry: CollectorRegistry | None = None,
    clock: Callable[[], float] | None = None,
) -> web.Application:
    """Return the proxy as an aiohttp application.

    :param settings: The validated settings.
    :param compaction: Decides what each compacted request forwards; `PassThrough` (forward as received) when None.
        If it has a `register_metrics(registry)` method, that is called once here with the app's registry; if it has an
        async `warm_up()`, that is awaited on startup, before the proxy listens; if it has an async `aclose()`, that
        is awaited when the app cleans up.
    :param registry: The Prometheus registry `/metrics` serves; a fresh one per app when None.
    :param clock: What the compaction side times its per-conversation ledger by (seconds), if it has a
        `use_clock(clock)` method; the wall clock when None. A test passes the fake clock its fake upstream's prompt
        cache runs on, and advances it instead of waiting.
    """
    metrics = ProxyMetrics(registry, pod_directory=shared_directory(settings.workers))
    compaction = compaction if compaction is not None else PassThrough()
    register_metrics = getattr(compaction, "register_metrics", None)
    if callable(register_metrics):
        register_metrics(metrics.registry)
    use_clock = getattr(compaction, "use_clock", None)
    if clock is not None and callable(use_clock):
        use_clock(clock)

    app = web.Application(
        client_max_size=settings.max_body_bytes,
        # Without proxy keys the key check lets everything through: no layer for it on every request.
        middlewares=[accounting, inbound_auth] if settings.proxy_keys else [accounting],
        handler_args=handler_args(settings),
    )
    app[SETTINGS] = settings
    app[COMPACTION] = compaction
    app[METRICS] = metrics
    app[READINESS] = Readiness()
    app[OPEN_TUNNELS] = set()
    app[TUNNEL_SLOTS] = TunnelSlots(socket_cap(settings.max_websockets, settings.max_connections))
    health.add_routes(app)
    dashboard.add_routes(app)
    conversations.add_routes(app)
    add_prices(app)
    app.router.add_route("*", "/{tail:.*}", proxy_request)
    app.cleanup_ctx.append(_route_table)
    app.cleanup_ctx.append(exporter)
    app.on_startup.append(_warm_up)
    app.on_startup.append(_ready)
    app.on_shutdown.append(_stopping)
    app.on_shutdown.append(close_tunnels)
    app.on_cleanup.append(_close_chat)
    return app


def runner_options(settings: Settings) -> dict[str, Any]:
    """Options for `web.AppRunner` (or `run_app`) that the settings decide: the graceful-shutdown window."""
    return {"shutdown_timeout": settings.shutdown_grace_seconds}


async def _route_table(app: web.Application) -> AsyncIterator[None]:
    """Open every route's pooled client on startup; close them on cleanup, after in-flight requests are done."""
    app[ROUTES] = RouteTable.open(app[SETTINGS])
    try:
        yield
    finally:
        await app[ROUTES].aclose()


async def _warm_up(app: web.Application) -> None:
    warm_up = getattr(app[COMPACTION], "warm_up", None)
    if callable(warm_up):
        await warm_up()


async def _ready(app: web.Application) -> None:
    app[READINESS].started()


async def _stopping(app: web.Application) -> None:
    app[READINESS].stopping()


async def _close_chat(app: web.Application) -> None:
    """Release the compaction side; a failure there is logged, never allowed to abort the shutdown."""
    aclose = getattr(app[COMPACTION], "aclose", None)
    if callable(aclose):
        try:
            await aclose()
        except Exception as exc:
            log.error("closing the compaction side failed", extra={"fields": {"error": type(exc).__name__}})
