"""The route table: which upstream each request goes to, each route with its own pooled client.

Built from the settings (`Settings.route_table`: the operator's routes in order, then the built-in `anthropic` and
`default`); the first route whose every condition holds takes the request. Conditions read the path, the headers, the
API (`WireFormat.api` of the format the request is of, or whose `api_headers` it carries; else OpenAI's) and, for a
route that names model patterns, the `model` of a body the proxy reads anyway (the compacted formats'): a request
whose body is streamed through unread, or a WebSocket upgrade, matches no model pattern.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import lru_cache
from typing import Final

import orjson

from proxy.config import Settings
from proxy.config.routes import DEFAULT_API, RouteSettings
from proxy.formats import api_of
from proxy.pipeline.off_loop import OFF_LOOP_BYTES
from proxy.pipeline.wire import WireFormat
from proxy.server.upstream import Upstream

PATHS_REMEMBERED: Final = 256
"""Paths (with their API) whose route a table without header or model conditions remembers, the least recently used
forgotten first."""


@dataclass(frozen=True)
class Route:
    """One upstream and the requests it takes.

    :param settings: The route's conditions and its own upstream settings.
    :param upstream: Its client: its origin, TLS trust, timeouts and connection pool.
    """

    settings: RouteSettings
    upstream: Upstream

    @property
    def name(self) -> str:
        """The route's name (the `upstream` metrics label, the access log's `upstream` field)."""
        return self.settings.name

    def takes(self, path: str, headers: Mapping[str, str], model: str | None, api: str) -> bool:
        """Whether every condition the route names holds for this request (of the API `api`)."""
        route = self.settings
        if route.path_prefix is not None and not path.startswith(route.path_prefix):
            return False
        if route.models and (model is None or not any(fnmatchcase(model, pattern) for pattern in route.models)):
            return False
        if route.header is not None and not _header_matches(route.header, headers):
            return False
        return not route.api or api == route.api


def _header_matches(condition: str, headers: Mapping[str, str]) -> bool:
    """Whether `headers` carry the header of `condition` (`Name`, or `Name=pattern` for a value matching it)."""
    name, _, pattern = condition.partition("=")
    value = headers.get(name.strip())
    return value is not None and (not pattern or fnmatchcase(value, pattern.strip()))


class RouteTable:
    """The app's routes, in the order they are matched (the last, `default`, takes everything).

    :param routes: The routes; created by `open` with their clients.
    """

    def __init__(self, routes: tuple[Route, ...]) -> None:
        self.routes = routes
        self.reads_models = any(route.settings.models for route in routes)
        """Whether a route names model patterns: only then is a body parsed to choose."""
        by_path_alone = not any(route.settings.models or route.settings.header is not None for route in routes)
        self._by_path = lru_cache(maxsize=PATHS_REMEMBERED)(self._first_by_path) if by_path_alone else None
        """The route of each path and API, remembered when nothing else decides (no route names a header or a model)."""

    @classmethod
    def open(cls, settings: Settings) -> RouteTable:
        """The table the settings describe, each route's client opened (closed by `aclose`)."""
        routes = []
        for route in settings.route_table():
            own = settings.for_route(route)
            routes.append(Route(route, Upstream(own, Upstream.create_session(own))))
        return cls(tuple(routes))

    def choose(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        model: str | None = None,
        wire: WireFormat | None = None,
    ) -> Route:
        """The first route that takes the request.

        :param wire: The format the server already found the request to be of, if any (else `api_of` tells its API).
        """
        wire = wire or api_of(method, path, headers)
        api = wire.api if wire is not None else DEFAULT_API
        if self._by_path is not None:
            return self._by_path(path, api)
        return next(route for route in self.routes if route.takes(path, headers, model, api))

    def _first_by_path(self, path: str, api: str) -> Route:
        """The first route that takes a request to `path` of `api`, for routes that name no header and no model."""
        return next(route for route in self.routes if route.takes(path, {}, None, api))

    async def choose_for_body(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes, wire: WireFormat | None = None
    ) -> Route:
        """`choose` for a request whose body was read, with its `model` when a route names model patterns."""
        if not self.reads_models:
            return self.choose(method, path, headers, wire=wire)
        model = _model_of(body) if len(body) < OFF_LOOP_BYTES else await asyncio.to_thread(_model_of, body)
        return self.choose(method, path, headers, model, wire)

    async def aclose(self) -> None:
        """Close every route's connection pool."""
        for route in self.routes:
            await route.upstream.session.close()


def _model_of(body: bytes) -> str | None:
    """The top-level `model` of a JSON body, or None."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    model = value.get("model") if isinstance(value, dict) else None
    return model if isinstance(model, str) else None
