"""The one way the proxy opens HTTP client sessions to its upstream: relaying, summaries and window probes alike.

Every session trusts what the upstream connection trusts (the system's CAs plus `upstream_ca_bundle`), keeps no
cookies (a shared jar would carry one caller's session to another), takes no proxy or netrc settings from the
environment, and reads bodies as they came (compressed ones stay compressed), so every bound on what is read holds.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from proxy.config import Settings


def upstream_session(
    settings: Settings, *, total_seconds: float | None = None, pool_limit: int = 100, **options: Any
) -> aiohttp.ClientSession:
    """A client session for the configured upstream.

    :param total_seconds: How long one exchange may take in all; None for no limit (streams last as long as they
        last; the callers bound the time to the first byte and between pieces themselves).
    :param pool_limit: Connections open at once; 0 for no limit.
    :param options: More `aiohttp.ClientSession` options.
    """
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=pool_limit, ttl_dns_cache=60, ssl=settings.upstream_ssl()),
        timeout=aiohttp.ClientTimeout(total=total_seconds, sock_connect=settings.connect_timeout),
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
        auto_decompress=False,
        **options,
    )
