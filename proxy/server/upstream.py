"""The one way out: a pooled HTTP client bound to the configured upstream, with the proxy's timeouts.

Every request goes to the upstream's origin and base path, whatever the client's request line or Host header said.
Responses are read raw (`auto_decompress=False`): compressed bodies reach the client with their Content-Encoding
intact and are never decompressed twice. Cookies are never stored: a shared jar would leak one caller's cookies to
another.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from proxy.config import Settings

SKIP_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
"""Headers aiohttp would add on its own: the upstream must see the client's (or none), not aiohttp's."""


class UpstreamError(Exception):
    """The upstream exchange failed in transport (not an HTTP error status, which is relayed as it came)."""

    kind = "unreachable"


class UpstreamUnreachable(UpstreamError):
    """No connection, or the connection broke before the response headers: answered 502."""


class UpstreamTimeout(UpstreamError):
    """Connecting, the first byte or a pause within the body took longer than allowed: answered 504."""

    kind = "timeout"


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Upstream:
    """Sends requests to the configured upstream over one `aiohttp.ClientSession` (created and closed by the app).

    :param settings: Supplies the upstream URL and the timeouts.
    :param session: The app's session; None creates one here (see `create_session`).
    """

    def __init__(self, settings: Settings, session: aiohttp.ClientSession) -> None:
        self.base = URL(settings.upstream)
        self.session = session
        self.first_byte_timeout = settings.first_byte_timeout
        self.idle_timeout = settings.idle_timeout

    @staticmethod
    def create_session(settings: Settings) -> aiohttp.ClientSession:
        """Return the pooled client session the app keeps for its lifetime."""
        timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=settings.connect_timeout, sock_read=None)
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=60),
            timeout=timeout,
            auto_decompress=False,
            skip_auto_headers=SKIP_AUTO_HEADERS,
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
        )

    def url_for(self, raw_path: str, raw_query: str) -> URL:
        """Return the upstream URL for an already-validated raw path and raw query: base path + path + query."""
        base_path = self.base.raw_path.rstrip("/")
        return URL.build(
            scheme=self.base.scheme,
            host=self.base.raw_host or "",
            port=self.base.explicit_port,
            path=base_path + raw_path,
            query_string=raw_query,
            encoded=True,
        )

    @asynccontextmanager
    async def request(
        self, method: str, url: URL, headers: CIMultiDict[str], data: Any = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Send one request and yield the response once its headers arrived; the response is closed on exit.

        :raises UpstreamUnreachable: The upstream could not be connected to or broke off before answering.
        :raises UpstreamTimeout: Connecting or the response headers took too long.
        """
        try:
            async with asyncio.timeout(self.first_byte_timeout):
                response = await self.session.request(
                    method, url, headers=headers, data=data, allow_redirects=False, compress=None
                )
        except TimeoutError as exc:
            raise UpstreamTimeout(_describe(exc)) from exc
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise UpstreamUnreachable(_describe(exc)) from exc
        try:
            yield response
        finally:
            # Closing (not releasing) drops a half-read connection at once: a client that went away mid-stream
            # stops the upstream's generation instead of the proxy draining it.
            if response.content.at_eof():
                response.release()
            else:
                response.close()

    async def read_chunk(self, response: aiohttp.ClientResponse) -> bytes:
        """Return the next piece of the response body as it arrives (b"" at the end), within `idle_timeout`.

        :raises UpstreamTimeout: The upstream stayed silent too long.
        :raises UpstreamUnreachable: The connection broke mid-body.
        """
        try:
            async with asyncio.timeout(self.idle_timeout):
                return await response.content.readany()
        except TimeoutError as exc:
            raise UpstreamTimeout(_describe(exc)) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamUnreachable(_describe(exc)) from exc
