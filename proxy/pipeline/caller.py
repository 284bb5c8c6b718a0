"""Who sent a request, as its headers say: the tenant its credentials make, its window override, its state scope."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from xxhash import xxh3_128_digest

from proxy.config import Settings
from proxy.config.state import TENANT_HEADERS, tenant_id
from proxy.pipeline.reports import requested_window
from proxy.pipeline.wire import WireFormat

CONTEXT_WINDOW_HEADER: Final = "x-context-window"

MAX_CALLERS: Final = 4096
"""Callers remembered (see `Caller.of`); one not among them is made again (correct, only slower)."""


@dataclass(frozen=True)
class Caller:
    """Who sent a request, read once per request.

    :param tenant: A keyed hash of its credential headers: all state is scoped by it, and no key is ever stored.
    :param requested_window: The window `X-Context-Window` asks for, if it asks for one.
    :param warning: What to answer in `X-Compaction-Warning` when that header is not a window.
    :param scope: The state scope: the tenant, under the window override if there is one (see `state_scope`).
    """

    tenant: bytes
    requested_window: int | None
    warning: str | None
    scope: bytes

    @classmethod
    def of(cls, headers: Mapping[str, str], settings: Settings, format_scope: str | None = None) -> Caller:
        """The caller of a request with these headers (lower-cased names), in a format of this `format_scope`.

        A caller sends the same headers on every request: it is made once for them (`_caller`), not per request.
        """
        credentials = tuple([headers.get(name, "") for name in TENANT_HEADERS])
        window = headers.get(CONTEXT_WINDOW_HEADER)
        if window is not None:
            window = window.strip()[:13]  # all `requested_window` reads of it: a longer value is as invalid
        return _caller(settings.tenant_key.get_secret_value(), credentials, window, format_scope)


@lru_cache(maxsize=MAX_CALLERS)
def _caller(tenant_key: str, credentials: tuple[str, ...], window: str | None, format_scope: str | None) -> Caller:
    """The caller sending `credentials` (its `TENANT_HEADERS`) and `window` (`X-Context-Window`) under `tenant_key`.

    A caller sends the same headers on every request, so its tenant's HMAC is computed once, not per request. The
    cache is keyed by the whole key and the whole credentials (compared in full, not by a digest), so an entry
    answers only the exact credentials under the exact tenant key it was made for: no caller can be given another's
    tenant. It lives in this process's memory only, as the credentials of the requests in flight do.
    """
    tenant = bytes.fromhex(tenant_id(tenant_key, credentials))
    requested, warning = requested_window(window)
    return Caller(tenant, requested, warning, state_scope(tenant, requested, format_scope))


def state_scope(tenant: bytes, requested_window: int | None, format_scope: str | None = None) -> bytes:
    """The state scope of a request: its tenant, under a per-request window override and its wire format.

    A rewrite made for `X-Context-Window: N` is replayed only to requests that send the same override, so one
    request's override is never remembered for the conversation's later turns without it. A Responses API
    conversation has a scope of its own: its rewrites stand for items, which a chat completion's messages are not
    (`WireFormat.scope`).
    """
    scope = tenant
    if requested_window is not None and requested_window > 0:
        scope = xxh3_128_digest(scope + b"\0x-context-window\0" + str(requested_window).encode())
    if format_scope is not None:
        scope = xxh3_128_digest(scope + b"\0api\0" + format_scope.encode())
    return scope


def conversation_of(
    headers: Mapping[str, str], settings: Settings, wire: WireFormat | None, *, lowered: bool = False
) -> str | None:
    """The conversation a request names (metrics, logs): the configured header, else one of its format's.

    Its format's are the headers its clients send (`WireFormat.conversation_headers`).

    :param headers: The request headers, any case.
    :param lowered: The names in `headers` are lower-cased already (the pipeline's): they are looked up as they are.
    """
    names = _lowered_names(settings.conversation_header, wire.conversation_headers if wire is not None else ())
    if not lowered:
        headers = {name.lower(): value for name, value in headers.items()}
    for name in names:
        value = headers.get(name)
        if value is not None:
            return value
    return None


@lru_cache(maxsize=64)
def _lowered_names(configured: str, named_by_format: tuple[str, ...]) -> tuple[str, ...]:
    """The conversation headers to look for, in order, lower-cased once per setting and format, not per request."""
    return tuple(name.lower() for name in (configured, *named_by_format))
