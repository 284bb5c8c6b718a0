"""What a request is: its route kind (metrics, logs), whether compaction should see it, whether its path is safe."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Final
from urllib.parse import unquote

from proxy.chat.exchange import Api

_CHAT_PATH: Final = re.compile(r"^(?:/[^/]+)*/chat/completions/?$")
"""`/v1/chat/completions`, with any base-path prefix (`/openai/v1/...`, `/api/v1/...`) or the Azure form
`/openai/deployments/{name}/chat/completions`."""

_RESPONSES_PATH: Final = re.compile(r"^(?:/[^/]+)*/responses/?$")
"""`/v1/responses` (creating a response), with any base-path prefix (`/openai/v1/responses`); not its sub-resources
(`/v1/responses/{id}`, `/v1/responses/compact`, `/v1/responses/input_tokens`), which are only forwarded."""

INTERNAL_PATHS: Final = frozenset({"/healthz", "/readyz", "/metrics"})
"""Paths the proxy serves itself (for GET) instead of forwarding."""


class RouteKind(StrEnum):
    """A coarse request class: a bounded label set for metrics."""

    CHAT = "chat_completions"
    EMBEDDINGS = "embeddings"
    MODELS = "models"
    RESPONSES = "responses"
    OTHER = "other"
    INTERNAL = "internal"


def is_chat_completion(method: str, path: str) -> bool:
    """Whether the request is a chat completion the compaction side should see."""
    return method == "POST" and _CHAT_PATH.match(path) is not None


def compacted_api(method: str, path: str) -> Api | None:
    """The wire format of a request the compaction side should see (a chat completion, a response), or None."""
    if method != "POST":
        return None
    if _CHAT_PATH.match(path) is not None:
        return Api.CHAT
    if _RESPONSES_PATH.match(path) is not None:
        return Api.RESPONSES
    return None


def is_websocket_upgrade(method: str, upgrade: str | None) -> bool:
    """Whether the request asks to switch to WebSocket (RFC 6455: a GET with `Upgrade: websocket`)."""
    return method == "GET" and upgrade is not None and upgrade.strip().lower() == "websocket"


def socket_api(path: str) -> Api | None:
    """The wire format of the messages on a WebSocket to `path` that compaction should see, or None.

    A socket to `/v1/responses` speaks the Responses API's WebSocket mode (`response.create` messages).
    """
    return Api.RESPONSES if _RESPONSES_PATH.match(path) is not None else None


def route_kind(method: str, path: str) -> RouteKind:
    """Classify a request by its (decoded) path."""
    if path in INTERNAL_PATHS:
        return RouteKind.INTERNAL
    if is_chat_completion(method, path):
        return RouteKind.CHAT
    segments = [segment for segment in path.split("/") if segment]
    if "embeddings" in segments:
        return RouteKind.EMBEDDINGS
    if "models" in segments:
        return RouteKind.MODELS
    if "responses" in segments:
        return RouteKind.RESPONSES
    return RouteKind.OTHER


def safe_raw_path(raw_path: str) -> str | None:
    """Return the raw (still percent-encoded) path to forward, or None when it must be refused.

    Refused: anything not starting with `/` (asterisk-form, garbage) and any dot segment (`.`, `..`), also when
    percent-encoded or hidden behind an encoded slash or a backslash, so no upstream path normalization can climb
    above the configured base path. Leading runs of slashes collapse to one (`//host/x` is no authority here).
    """
    if not raw_path.startswith("/"):
        return None
    decoded = unquote(raw_path)
    if any(part in (".", "..") for part in re.split(r"[/\\]", decoded)):
        return None
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in decoded):
        return None
    return "/" + raw_path.lstrip("/")
