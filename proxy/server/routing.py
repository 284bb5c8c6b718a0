"""Taking a request's route: the one place the server chooses it and writes it down for the rest of the request."""

from __future__ import annotations

from aiohttp import web
from yarl import URL

from proxy.pipeline.wire import WireFormat
from proxy.server.keys import RECORD, ROUTE, ROUTES


async def take_route(
    request: web.Request, raw_path: str, body: bytes | None = None, wire: WireFormat | None = None
) -> URL:
    """Choose the request's route (`ROUTE`, the record's `upstream`) and return the URL it forwards to.

    :param raw_path: The validated raw path (`proxy.server.routes.safe_raw_path`).
    :param body: The request body, when the proxy read it (a route may choose by the `model` it names).
    :param wire: The format the server matched the request's path to, when it did (the route needs its API).
    """
    routes = request.app[ROUTES]
    if body is None or not routes.reads_models:
        route = routes.choose(request.method, request.path, request.headers, wire=wire)
    else:
        route = await routes.choose_for_body(request.method, request.path, request.headers, body, wire)
    request[ROUTE] = route
    request[RECORD].upstream = route.name
    return route.upstream.url_for(raw_path, request.rel_url.raw_query_string)
