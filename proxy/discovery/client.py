"""The probes' way to the upstream: small, bounded requests to the configured upstream and nowhere else.

A probe carries nothing of a caller's request: a fixed path, a body the proxy builds itself (Ollama's
`{"model": name}`), and the caller's credential headers only once the upstream refused to answer without them.
Redirects are not followed, proxies from the environment and cookies are not used, and answers are asked for
uncompressed and read up to a bound, so whatever the upstream does a probe costs little memory for little time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, Final

import aiohttp
import orjson

from proxy.config import CREDENTIAL_HEADERS, Settings
from proxy.upstream_session import upstream_session

PROBE_SECONDS: Final = 5.0
"""How long one probe request may take in all (connecting, waiting and reading) before it counts as unanswered."""
MAX_ANSWER_BYTES: Final = 4 * 2**20
"""The largest answer read (a model listing with many adapters is still far smaller); a larger one is ignored."""
_REFUSALS: Final = (401, 403)


async def cancel(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel the tasks and wait until they are done (at shutdown)."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


def credentials_of(headers: Mapping[str, str]) -> dict[str, str]:
    """The caller's credential headers (from lower-cased `headers`), the only ones a probe may carry."""
    return {name: headers[name] for name in CREDENTIAL_HEADERS if headers.get(name)}


class CredentialsNeeded(Exception):
    """The upstream answered 401 or 403: it describes its models only to callers it knows."""


class ProbeClient:
    """Sends the probes' requests to the upstream over a session of its own, created on first use.

    :param settings: The configured upstream (probe paths are appended to its URL), its TLS trust and connect timeout.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.upstream = settings.upstream
        self._session: aiohttp.ClientSession | None = None

    async def fetch(
        self, method: str, path: str, body: Mapping[str, Any] | None, credentials: Mapping[str, str]
    ) -> Any:
        """The upstream's parsed JSON answer to `method path`, or None for any other status, failure or shape.

        :param credentials: The caller's credential headers to send (none for an anonymous probe).
        :raises CredentialsNeeded: The upstream answered 401 or 403.
        """
        headers = {"Accept": "application/json", "Accept-Encoding": "identity", **credentials}
        try:
            async with self._client().request(
                method,
                self.upstream + path,
                data=orjson.dumps(body) if body is not None else None,
                headers={**headers, "Content-Type": "application/json"} if body is not None else headers,
                allow_redirects=False,
            ) as response:
                if response.status in _REFUSALS:
                    raise CredentialsNeeded
                if response.status != 200:
                    return None
                payload = await read_bounded(response)
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None
        try:
            return orjson.loads(payload) if payload is not None else None
        except orjson.JSONDecodeError:
            return None

    async def aclose(self) -> None:
        """Close the session (called when the proxy shuts down)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = upstream_session(self.settings, total_seconds=PROBE_SECONDS)
        return self._session


async def read_bounded(response: aiohttp.ClientResponse) -> bytes | None:
    """The answer's body, or None as soon as it exceeds `MAX_ANSWER_BYTES`."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
