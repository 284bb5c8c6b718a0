"""The proxy's own endpoints: liveness, readiness and Prometheus metrics. Never forwarded."""

from __future__ import annotations

from aiohttp import web

from proxy.server.keys import COMPACTION, METRICS, READINESS, ROUTES
from proxy.server.readiness import unready_reason


async def healthz(request: web.Request) -> web.Response:
    """200 while the process can answer at all."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """200 once started, 503 before that and from the moment shutdown begins.

    A replica whose state store does not answer still forwards every request (uncompacted: fail open), and every
    replica of a gateway shares that store, so a 503 then would take the whole Service out of rotation for nothing:
    the answer stays 200, with `{"status": "degraded", "reason": ...}` for people and monitors to see. The same holds
    for a route's upstream that the route's last request could not connect to (every replica shares it too).
    """
    readiness = request.app[READINESS]
    if not readiness.ready:
        state = "shutting_down" if readiness.shutting_down else "starting"
        return web.json_response({"status": state}, status=503)
    reason = await unready_reason(request.app[COMPACTION])
    unreachable = next((route for route in request.app[ROUTES].routes if route.upstream.unreachable), None)
    if reason is None and unreachable is not None:
        reason = (
            f"the last request on route {unreachable.name} could not connect to its upstream"
            f" ({unreachable.upstream.unreachable}); its requests are answered 502 until it answers: check the"
            " upstream setting and that the upstream is up"
        )
    if reason is not None:
        return web.json_response({"status": "degraded", "reason": reason})
    return web.json_response({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    """The app's registry in the Prometheus text format."""
    body, content_type = request.app[METRICS].render()
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type
    return response


def add_routes(app: web.Application) -> None:
    """Register `/healthz`, `/readyz` and `/metrics` (GET and HEAD)."""
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
