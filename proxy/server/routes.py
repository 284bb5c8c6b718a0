"""What a request is: its route kind (metrics, logs) and whether its path is safe to forward."""

from __future__ import annotations

import re
from enum import StrEnum
from functools import lru_cache
from typing import Final
from urllib.parse import unquote

from proxy.formats import PATHS_REMEMBERED, format_of
from proxy.pipeline.wire import WireFormat

INTERNAL_PATHS: Final = frozenset({"/healthz", "/readyz", "/metrics"})
"""Paths the proxy serves itself (for GET) instead of forwarding."""


DASHBOARD_PATHS: Final = frozenset(
    {"/dashboard", "/dashboard.json", "/dashboard.js", "/dashboard.css", "/dashboard.svg", "/favicon.ico"}
    | {f"/dashboard/{name}" for name in ("conversations", "conversation", "conversation.css")}
    | {f"/dashboard/conversation{name}.js" for name in ("", "_plots", "_bill")}
)
"""The dashboard's page, data and assets (see `proxy.server.dashboard`): served (for GET) behind the proxy keys."""

DASHBOARD_PREFIX: Final = "/dashboard/"
"""Under it, the dashboard's per-conversation data (see `proxy.server.conversations`), also behind the proxy keys."""


def is_dashboard(path: str) -> bool:
    """Whether `path` is one of the dashboard's (`DASHBOARD_PATHS`, or under `DASHBOARD_PREFIX`)."""
    return path in DASHBOARD_PATHS or path.startswith(DASHBOARD_PREFIX)


class RouteKind(StrEnum):
    """A coarse class of the requests no wire format compacts: with the formats' names, a bounded label set."""

    EMBEDDINGS = "embeddings"
    MODELS = "models"
    RESPONSES = "responses"
    OTHER = "other"
    INTERNAL = "internal"


def is_websocket_upgrade(method: str, upgrade: str | None) -> bool:
    """Whether the request asks to switch to WebSocket (RFC 6455: a GET with `Upgrade: websocket`)."""
    return method == "GET" and upgrade is not None and upgrade.strip().lower() == "websocket"


def socket_format(path: str) -> WireFormat | None:
    """The wire format whose requests come as messages on a WebSocket to `path` (`WireFormat.socket`), or None.

    A socket to `/v1/responses` speaks the Responses API's WebSocket mode (`response.create` messages).
    """
    wire = format_of("POST", path)
    return wire if wire is not None and wire.socket is not None else None


@lru_cache(maxsize=PATHS_REMEMBERED)
def route_kind(method: str, path: str) -> str:
    """Classify a request by its (decoded) path: the name of the wire format that compacts it, or a `RouteKind`.

    Remembered for the last `PATHS_REMEMBERED` paths asked about (a client's paths are few; others are classified
    again, correctly, only slower).
    """
    if path in INTERNAL_PATHS or is_dashboard(path):
        return RouteKind.INTERNAL.value
    wire = format_of(method, path)
    if wire is not None:
        return wire.name
    segments = [segment for segment in path.split("/") if segment]
    if "embeddings" in segments:
        return RouteKind.EMBEDDINGS.value
    if "models" in segments:
        return RouteKind.MODELS.value
    if "responses" in segments:
        return RouteKind.RESPONSES.value
    return RouteKind.OTHER.value


_PLAIN_PATH: Final = re.compile(r"[\x20-\x24\x26-\x5b\x5d-\x7e]*")
"""Printable ASCII without `%` or a backslash: a path that decodes to itself and splits at `/` alone."""


def safe_raw_path(raw_path: str) -> str | None:
    """Return the raw (still percent-encoded) path to forward, or None when it must be refused.

    Refused: anything not starting with `/` (asterisk-form, garbage) and any dot segment (`.`, `..`), also when
    percent-encoded or hidden behind an encoded slash or a backslash, so no upstream path normalization can climb
    above the configured base path. Leading runs of slashes collapse to one (`//host/x` is no authority here).
    """
    if not raw_path.startswith("/"):
        return None
    if _PLAIN_PATH.fullmatch(raw_path) and "/." not in raw_path:
        return "/" + raw_path.lstrip("/")  # nothing encoded, no backslash or control: no dot segment hides in it
    decoded = unquote(raw_path)
    if any(part in (".", "..") for part in re.split(r"[/\\]", decoded)):
        return None
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in decoded):
        return None
    return "/" + raw_path.lstrip("/")
