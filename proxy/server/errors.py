"""Errors the proxy answers itself, in the shape of the API the request was for, as every SDK surfaces them.

A request of a wire format, or to another endpoint of its API (`WireFormat.api_headers`), gets that format's error
body (`WireFormat.error_body`: the Messages API's `{"type": "error", "error": {...}}`); any other OpenAI's
`{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from proxy.formats import api_of
from proxy.formats.chat_completions.errors import error_body as openai_error_body

ErrorShape = Callable[[str, str, str, str | None], bytes]
"""An error body for `(message, kind, code, param)` in one API's shape (`WireFormat.error_body`)."""


def shape_of(request: web.Request) -> ErrorShape:
    """The error shape of the API `request` is for: its wire format's (`api_of`), else OpenAI's."""
    wire = api_of(request.method, request.path, request.headers)
    return wire.error_body if wire is not None else openai_error_body


def error_response(
    status: int,
    message: str,
    *,
    type_: str,
    code: str,
    param: str | None = None,
    shape: ErrorShape = openai_error_body,
) -> web.Response:
    """Return a JSON error in `shape` (OpenAI's by default).

    :param status: HTTP status.
    :param message: Human-readable reason; never contains request bodies or credentials.
    :param type_: The error family: `invalid_request_error` for the client's fault, `upstream_error` when the
        provider could not be reached, `proxy_error` for the proxy's own (a format names it in its own terms).
    :param code: A stable machine-readable code.
    :param param: The request field at fault, if one is.
    """
    body = shape(message, type_, code, param)
    return web.Response(body=body, status=status, content_type="application/json", charset="utf-8")


def bad_path(shape: ErrorShape = openai_error_body) -> web.Response:
    """400 for a path the proxy refuses to forward (dot segments, not origin-form)."""
    return error_response(
        400,
        "The request path is not allowed (dot segments or not an absolute path).",
        type_="invalid_request_error",
        code="invalid_path",
        shape=shape,
    )


def too_large(limit: int, shape: ErrorShape = openai_error_body) -> web.Response:
    """413 for a request body larger than `max_body_bytes`."""
    return error_response(
        413,
        f"The request body exceeds the proxy's limit of {limit} bytes.",
        type_="invalid_request_error",
        code="request_too_large",
        shape=shape,
    )


def client_timeout(seconds: float, shape: ErrorShape = openai_error_body) -> web.Response:
    """408 when the body stalled (`client_body_timeout`) or trickled (`client_body_min_rate`); the connection closes."""
    response = error_response(
        408,
        f"The request body arrived too slowly (a pause over {seconds:g} seconds, or below the minimum average rate).",
        type_="invalid_request_error",
        code="request_timeout",
        shape=shape,
    )
    response.force_close()
    return response


def upstream_unreachable(failure: str, shape: ErrorShape = openai_error_body) -> web.Response:
    """502 when the upstream could not be connected to or broke the connection before answering.

    :param failure: What failed in plain words (an `UpstreamError`'s text): never a host, a port or upstream bytes.
    """
    return error_response(
        502,
        f"The upstream could not be reached: {failure}.",
        type_="upstream_error",
        code="upstream_unreachable",
        shape=shape,
    )


def upstream_timeout(failure: str, shape: ErrorShape = openai_error_body) -> web.Response:
    """504 when the upstream did not connect or answer in time.

    :param failure: What timed out in plain words (an `UpstreamTimeout`'s text): never a host or a port.
    """
    message = f"The upstream timed out: {failure}."
    return error_response(504, message, type_="upstream_error", code="upstream_timeout", shape=shape)


def internal_error(shape: ErrorShape = openai_error_body) -> web.Response:
    """500 for a bug in the proxy itself; details go to the log, never to the client."""
    message = "The proxy failed to handle the request."
    return error_response(500, message, type_="proxy_error", code="internal_error", shape=shape)
