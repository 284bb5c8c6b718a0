"""Errors the proxy answers itself, shaped like OpenAI's so every SDK surfaces them the usual way."""

from __future__ import annotations

from aiohttp import web


def error_response(status: int, message: str, *, type_: str, code: str, param: str | None = None) -> web.Response:
    """Return an OpenAI-style JSON error: `{"error": {"message", "type", "param", "code"}}`.

    :param status: HTTP status.
    :param message: Human-readable reason; never contains request bodies or credentials.
    :param type_: The error family: `invalid_request_error` for the client's fault, `upstream_error` when the
        provider could not be reached, `proxy_error` for the proxy's own.
    :param code: A stable machine-readable code.
    :param param: The request field at fault, if one is.
    """
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return web.json_response(body, status=status)


def bad_path() -> web.Response:
    """400 for a path the proxy refuses to forward (dot segments, not origin-form)."""
    return error_response(
        400,
        "The request path is not allowed (dot segments or not an absolute path).",
        type_="invalid_request_error",
        code="invalid_path",
    )


def too_large(limit: int) -> web.Response:
    """413 for a request body larger than `max_body_bytes`."""
    return error_response(
        413,
        f"The request body exceeds the proxy's limit of {limit} bytes.",
        type_="invalid_request_error",
        code="request_too_large",
    )


def client_timeout(seconds: float) -> web.Response:
    """408 when the body stalled (`client_body_timeout`) or trickled (`client_body_min_rate`); the connection closes."""
    response = error_response(
        408,
        f"The request body arrived too slowly (a pause over {seconds:g} seconds, or below the minimum average rate).",
        type_="invalid_request_error",
        code="request_timeout",
    )
    response.force_close()
    return response


def upstream_unreachable(failure: str) -> web.Response:
    """502 when the upstream could not be connected to or broke the connection before answering.

    :param failure: What failed in plain words (an `UpstreamError`'s text): never a host, a port or upstream bytes.
    """
    return error_response(
        502, f"The upstream could not be reached: {failure}.", type_="upstream_error", code="upstream_unreachable"
    )


def upstream_timeout(failure: str) -> web.Response:
    """504 when the upstream did not connect or answer in time.

    :param failure: What timed out in plain words (an `UpstreamTimeout`'s text): never a host or a port.
    """
    return error_response(504, f"The upstream timed out: {failure}.", type_="upstream_error", code="upstream_timeout")


def internal_error() -> web.Response:
    """500 for a bug in the proxy itself; details go to the log, never to the client."""
    return error_response(500, "The proxy failed to handle the request.", type_="proxy_error", code="internal_error")
