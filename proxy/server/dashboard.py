"""The dashboard: a page of the last hour's figures, and the JSON it draws them from, served when `dashboard` is on.

The page, its script and its style ship in the package (`proxy/server/static`) and load nothing from elsewhere: the
proxy often runs without the internet. The data is `/dashboard.json` (see `proxy.server.dashboard_figures`), which
scripts can read as well as the page. Both sit behind the proxy keys when they are set (`proxy.server.auth`). With
`dashboard` off, the paths answer 404 and say how to turn it on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial
from importlib import resources
from typing import Final

from aiohttp import web

from proxy.server import errors
from proxy.server.background import running
from proxy.server.dashboard_figures import FAMILIES, dashboard_json
from proxy.server.keys import METRICS, SETTINGS
from proxy.server.metric_ring import POINTS, STEP_SECONDS, MetricRing

RING = web.AppKey("metric_ring", MetricRing)
"""The last hour of the app's metrics; present while the app runs with `dashboard` on."""

ASSETS: Final = {
    "/dashboard": ("dashboard.html", "text/html"),
    "/dashboard.js": ("dashboard.js", "text/javascript"),
    "/dashboard.css": ("dashboard.css", "text/css"),
    "/dashboard.svg": ("dashboard.svg", "image/svg+xml"),
    "/favicon.ico": ("dashboard.svg", "image/svg+xml"),
    "/dashboard/conversations": ("conversation.html", "text/html"),
    "/dashboard/conversation": ("conversation.html", "text/html"),
    "/dashboard/conversation.js": ("conversation.js", "text/javascript"),
    "/dashboard/conversation_plots.js": ("conversation_plots.js", "text/javascript"),
    "/dashboard/conversation_bill.js": ("conversation_bill.js", "text/javascript"),
    "/dashboard/conversation.css": ("conversation.css", "text/css"),
}
"""The page and what it loads: path -> (file in `proxy/server/static`, content type). A browser asks for
`/favicon.ico` on its own (for `dashboard.json`, say): answered here, never forwarded to the upstream. The
conversation pages (`/dashboard/conversations`, the list; `/dashboard/conversation?id=...`, one) share one page,
which draws the list or the conversation from the ledger's JSON."""

DATA_PATH: Final = "/dashboard.json"

SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self';"
        " base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
"""The page runs only its own script, talks only to the proxy, cannot be framed, and is never cached."""


def _asset(name: str) -> bytes:
    return resources.files("proxy.server").joinpath("static", name).read_bytes()


def dashboard_off() -> web.Response:
    """The 404 every dashboard path answers while the dashboard is off: it says how to turn it on."""
    return errors.error_response(
        404,
        "The dashboard is off: start the proxy with --dashboard true (or COMPACTION_PROXY_DASHBOARD=true).",
        type_="invalid_request_error",
        code="dashboard_off",
    )


def add_routes(app: web.Application) -> None:
    """Register the page, its assets and its data (GET and HEAD), and sample the metrics while the app runs."""
    enabled = app[SETTINGS].dashboard
    for path, (name, content_type) in ASSETS.items():
        body = _asset(name) if enabled else None
        app.router.add_get(path, partial(_serve, body, content_type))
    app.router.add_get(DATA_PATH, data)
    if enabled:
        app.cleanup_ctx.append(_sampling)


async def _serve(body: bytes | None, content_type: str, request: web.Request) -> web.Response:
    """One of the page's files, or 404 when the dashboard is off."""
    if body is None:
        return dashboard_off()
    return web.Response(body=body, content_type=content_type, charset="utf-8", headers=SECURITY_HEADERS)


async def data(request: web.Request) -> web.Response:
    """The figures over the last hour (see `proxy.server.dashboard_figures.dashboard_json`).

    Computing them takes milliseconds (tens with many series): done off the event loop, which forwards requests.
    """
    ring = request.app.get(RING)
    if ring is None:
        return dashboard_off()
    figures = await asyncio.to_thread(dashboard_json, ring.read(), STEP_SECONDS, POINTS * STEP_SECONDS)
    return web.json_response(figures, headers=SECURITY_HEADERS)


async def _sampling(app: web.Application) -> AsyncIterator[None]:
    """Take the baseline snapshot at startup and one a minute after, until cleanup."""
    ring = MetricRing(app[METRICS].registry, FAMILIES)
    ring.sample()
    app[RING] = ring
    async with running(ring.run(STEP_SECONDS)):
        yield
