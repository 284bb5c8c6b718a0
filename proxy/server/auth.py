"""Optional inbound authentication for a shared gateway: callers must present one of the configured proxy keys.

A sidecar needs none (only its own pod reaches it). A gateway several teams share can require a key of its own,
separate from the provider credential the caller forwards: `X-Proxy-Key: <key>` or `Proxy-Authorization: Bearer
<key>`. Keys are compared in constant time (as SHA-256 digests, so neither the content nor the length of a
configured key leaks through timing), are never logged, and never reach the upstream: `Proxy-Authorization` is
hop-by-hop and `X-Proxy-Key` is dropped with it (see `proxy.server.headers`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.server import errors
from proxy.server.keys import RECORD, SETTINGS
from proxy.server.routes import INTERNAL_PATHS, is_dashboard

PROXY_KEY_HEADER: Final = "X-Proxy-Key"
"""The proxy's own credential header; removed before forwarding."""

_OPEN_METHODS: Final = frozenset({"GET", "HEAD"})


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


def presented_keys(request: web.Request) -> list[str]:
    """The candidate keys the request carries: every `X-Proxy-Key` value and every `Proxy-Authorization` bearer."""
    found = [value.strip() for value in request.headers.getall(PROXY_KEY_HEADER, ())]
    for value in request.headers.getall("Proxy-Authorization", ()):
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            found.append(token.strip())
    return found


def basic_passwords(request: web.Request) -> list[str]:
    """The passwords of the request's `Authorization: Basic` credentials (a browser login prompt); any user."""
    found = []
    for value in request.headers.getall("Authorization", ()):
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() != "basic":
            continue
        try:
            decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            continue
        _, colon, password = decoded.partition(":")
        if colon and password:
            found.append(password)
    return found


def key_matches(presented: list[str], allowed: list[bytes]) -> bool:
    """Whether any presented key equals any allowed digest; every pair is compared, with no early exit."""
    matched = False
    for candidate in presented:
        digest = _digest(candidate)
        for expected in allowed:
            matched |= hmac.compare_digest(digest, expected)
    return matched


@web.middleware
async def inbound_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer 401 (OpenAI-style) to a request without a valid proxy key, when proxy keys are configured.

    The proxy's own probes (`GET /healthz`, `/readyz`, `/metrics`) stay open, so kubelets and scrapers need no key.
    The dashboard (`is_dashboard`) is not open; a browser cannot set a header, so there the key may also come as
    the password of `Authorization: Basic` (the 401 asks for it), which is never forwarded from those paths.
    """
    settings = request.app[SETTINGS]
    if not settings.proxy_keys or (request.method in _OPEN_METHODS and request.path in INTERNAL_PATHS):
        return await handler(request)
    allowed = [_digest(key.get_secret_value()) for key in settings.proxy_keys]
    dashboard = is_dashboard(request.path)
    presented = presented_keys(request) + (basic_passwords(request) if dashboard else [])
    if key_matches(presented, allowed):
        return await handler(request)
    request[RECORD].error = "proxy_key"
    response = errors.error_response(
        401,
        "This proxy requires a proxy key: send it in the X-Proxy-Key header or as Proxy-Authorization: Bearer <key>"
        + (" (in a browser: as the password, any user name)." if dashboard else "."),
        type_="invalid_request_error",
        code="invalid_proxy_key",
    )
    scheme = "Basic" if dashboard else "Bearer"
    response.headers["WWW-Authenticate"] = f'{scheme} realm="compaction-proxy"'
    return response
