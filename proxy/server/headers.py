"""Which headers cross the proxy: hop-by-hop headers (RFC 9110 section 7.6.1) stop here, everything else passes.

A transparent proxy must not forward headers that describe one connection (its framing, keep-alive, upgrades,
proxy credentials) to the next one, and must let the upstream see its own Host. Everything end-to-end, including
`Authorization`, `api-key`, `Content-Encoding` and the upstream's `retry-after`, `x-ratelimit-*` and `openai-*`
answers, is copied as-is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Final

from multidict import CIMultiDict, CIMultiDictProxy

HOP_BY_HOP: frozenset[str] = frozenset(
    {"connection", "keep-alive", "te", "trailer", "trailers", "transfer-encoding", "upgrade", "proxy-connection"}
)
"""Hop-by-hop header names (lower case); every `Proxy-*` header and whatever `Connection` lists are dropped too."""

CONTROL_HEADERS: frozenset[str] = frozenset(
    {"x-compaction", "x-compaction-client", "x-compaction-offload", "x-context-window"}
)
"""Request headers that instruct the proxy itself (lower case): compaction off, the client-compaction policy,
offloading off, the window for one request. They are read before forwarding and never sent on: they mean nothing to
the provider. `X-Conversation-Id` is not one of them: a provider may use it too, so it passes."""

REQUEST_ONLY_DROPS: frozenset[str] = frozenset({"host", "expect", "x-proxy-key"} | CONTROL_HEADERS)
"""Request headers the proxy sets itself or consumes: Host becomes the upstream's, `Expect: 100-continue` is answered
here, `X-Proxy-Key` (the proxy's own inbound credential, see `proxy.server.auth`) and the `CONTROL_HEADERS` never
leave it."""

SENSITIVE: frozenset[str] = frozenset(
    {"authorization", "api-key", "x-api-key", "cookie", "set-cookie", "proxy-authorization", "x-proxy-key"}
)
"""Headers whose values must never appear in logs."""

Headers = CIMultiDictProxy[str] | CIMultiDict[str]


def connection_listed(headers: Headers) -> set[str]:
    """Return the (lower-case) header names listed in the `Connection` header(s): they are hop-by-hop as well."""
    listed: set[str] = set()
    for value in headers.getall("Connection", ()):
        listed.update(token.strip().lower() for token in value.split(",") if token.strip())
    return listed


NAMES_REMEMBERED: Final = 1024
"""Header names (as spelled, with a set of drops) whose verdict `_passes` remembers, the least recently used
forgotten first."""


@lru_cache(maxsize=NAMES_REMEMBERED)
def _passes(name: str, drop: frozenset[str]) -> bool:
    """Whether a header named `name` is neither in `drop` (lower case) nor a `Proxy-*` header.

    Remembered by the name's exact spelling: the same few names come with every request, and a lookup costs less
    than lower-casing and testing each anew.
    """
    lower = name.lower()
    return lower not in drop and not lower.startswith("proxy-")


def _end_to_end(headers: Headers, drop: frozenset[str]) -> CIMultiDict[str]:
    """`headers` without `Proxy-*`, what `Connection` lists and the names in `drop` (lower case, hop-by-hop too)."""
    listed = connection_listed(headers) if "Connection" in headers else None
    kept: CIMultiDict[str] = CIMultiDict()
    add = kept.add
    for name, value in headers.items():
        if _passes(name, drop) and (listed is None or name.lower() not in listed):
            add(name, value)
    return kept


DROPPED_UPSTREAM: Final = HOP_BY_HOP | REQUEST_ONLY_DROPS
"""Every request header name (lower case) never sent upstream."""


@lru_cache(maxsize=16)
def _dropped_upstream(also_drop: tuple[str, ...]) -> frozenset[str]:
    """`DROPPED_UPSTREAM` and the names in `also_drop` (any case)."""
    return DROPPED_UPSTREAM | {name.lower() for name in also_drop}


def upstream_request_headers(
    headers: Headers, *, body_length: int | None = None, drop: Iterable[str] = ()
) -> CIMultiDict[str]:
    """Return the headers to send upstream for a client request.

    :param headers: The client's request headers.
    :param body_length: When the proxy sends a body of its own (a rewritten chat request), its length: replaces the
        client's Content-Length. None keeps the client's framing header as it was.
    :param drop: More header names (lower case) that no longer describe the body sent, e.g. `content-encoding`.
    """
    kept = _end_to_end(headers, _dropped_upstream(tuple(drop)) if drop else DROPPED_UPSTREAM)
    if body_length is not None:
        kept.popall("Content-Length", None)
        kept["Content-Length"] = str(body_length)
    return kept


def with_list_values(headers: CIMultiDict[str], added: Mapping[str, str]) -> None:
    """Add each value to the comma-separated list its header holds (RFC 9110 5.3), unless it is listed already.

    The values the client sent are kept, in their order; a header it did not send is set to the value alone.
    """
    for name, value in added.items():
        present = [item.strip() for line in headers.getall(name, ()) for item in line.split(",") if item.strip()]
        if value in present:
            continue
        headers.popall(name, None)
        headers[name] = ",".join([*present, value])


def client_response_headers(
    headers: Headers, *, extra: Mapping[str, str] | None = None, drop_length: bool = False
) -> CIMultiDict[str]:
    """Return the headers to send the client for an upstream response.

    :param headers: The upstream's response headers.
    :param extra: Headers the proxy adds (what compaction did); they replace same-named upstream headers.
    :param drop_length: The relayed body differs from the upstream's (a stripped usage chunk), so its
        Content-Length no longer holds.
    """
    kept = _end_to_end(headers, HOP_BY_HOP)
    if drop_length:
        kept.popall("Content-Length", None)
    for name, value in (extra or {}).items():
        kept[name] = value
    return kept


def content_encoding(headers: Headers) -> str:
    """Return the body's content coding, lower case: `identity` when none is declared."""
    value = headers.get("Content-Encoding", "").strip().lower()
    return value or "identity"
