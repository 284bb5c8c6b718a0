"""What a test scripts and observes on the OpenAI upstream: each request as received, and failures to inject.

`RecordedRequest` is one request byte for byte; a `Failure` answers the next request with an error status and body
(OpenAI's for the status unless given), drops the connection, or cuts a stream after some chunks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy, MultiDict, MultiDictProxy

from proxy.simulator.openai_common import json_response

__all__ = ["Failure", "RecordedRequest", "drop_connection", "failure_response", "record"]


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the fake received it, byte for byte."""

    method: str
    path: str
    raw_path: str
    query_string: str
    query: MultiDictProxy[str]
    headers: CIMultiDictProxy[str]
    body: bytes
    json: Any | None


@dataclass(frozen=True)
class Failure:
    """A scripted failure for the next request (see `OpenAIUpstream.fail_next`)."""

    status: int = 500
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    reset: bool = False
    cut_after_chunks: int | None = None
    delay: float = 0.0


_DEFAULT_FAILURE_BODIES: dict[int, tuple[str, str, str | None]] = {
    429: ("Rate limit reached for requests. Please try again later.", "requests", "rate_limit_exceeded"),
    500: ("The server had an error while processing your request. Sorry about that!", "server_error", None),
    502: ("Bad gateway.", "server_error", None),
    503: ("The engine is currently overloaded, please try again later.", "server_error", None),
}


def _failure_body(failure: Failure) -> Any:
    if failure.body is not None:
        return failure.body
    message, kind, code = _DEFAULT_FAILURE_BODIES.get(
        failure.status, (f"Simulated upstream failure {failure.status}.", "server_error", None)
    )
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def failure_response(failure: Failure) -> web.Response:
    """The response a scripted `failure` answers with."""
    body = _failure_body(failure)
    headers = CIMultiDict(failure.headers)
    if isinstance(body, bytes | str):
        return web.Response(
            body=body.encode() if isinstance(body, str) else body, status=failure.status, headers=headers
        )
    return json_response(body, status=failure.status, headers=headers)


def record(request: web.Request, body: bytes) -> RecordedRequest:
    """`request` as received, its body parsed when it is JSON."""
    try:
        parsed: Any | None = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        parsed = None
    return RecordedRequest(
        method=request.method,
        path=request.path,
        raw_path=request.rel_url.raw_path,
        query_string=request.query_string,
        query=MultiDictProxy(MultiDict(request.query)),
        headers=CIMultiDictProxy(CIMultiDict(request.headers)),
        body=body,
        json=parsed,
    )


def drop_connection(request: web.Request) -> None:
    """Reset the client's connection mid-response (or before one), as a crashing upstream or LB would."""
    if request.transport is not None:
        request.transport.abort()
