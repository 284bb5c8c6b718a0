"""The probes' way to the upstream: small, bounded requests to the configured upstream and nowhere else.

A probe carries nothing of a caller's request: a fixed path, a body the proxy builds itself (Ollama's
`{"model": name}`), and the caller's credential headers only once the upstream refused to answer without them.
Redirects are not followed, proxies from the environment and cookies are not used, and answers are asked for
uncompressed and read up to a bound, so whatever the upstream does a probe costs little memory for little time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ProbeAnswer:
    """What the upstream answered a probe: its status and headers, and its body.

    The body is read only for a 200: None for any other status, or for a body over `MAX_ANSWER_BYTES`.
    """

    status: int
    headers: Mapping[str, str]
    payload: bytes | None


class ProbeClient:
    """Sends the probes' requests to the upstream over a session of its own, created on first use.

    :param settings: The configured upstream (probe paths are appended to its URL), its TLS trust and connect timeout.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.upstream = settings.upstream
        self._session: aiohttp.ClientSession | None = None
        self.reached = True
        """Whether the last probe reached the upstream (an answer of any status), so that a run that found nothing
        can say why: the upstream did not report a window, or could not be asked."""

    async def fetch(
        self, method: str, path: str, body: Mapping[str, Any] | None, credentials: Mapping[str, str]
    ) -> Any:
        """The upstream's parsed JSON answer to `method path`, or None for any other status, failure or shape.

        :param credentials: The caller's credential headers to send (none for an anonymous probe).
        :raises CredentialsNeeded: The upstream answered 401 or 403.
        """
        answer = await self.send(method, path, orjson.dumps(body) if body is not None else None, credentials)
        if answer is not None and answer.status in _REFUSALS:
            raise CredentialsNeeded
        if answer is None or answer.payload is None:
            return None
        try:
            return orjson.loads(answer.payload)
        except orjson.JSONDecodeError:
            return None

    async def send(self, method: str, path: str, data: bytes | None, headers: Mapping[str, str]) -> ProbeAnswer | None:
        """Send `method path` with a JSON body already serialized (or none), and what the upstream answered.

        None when the upstream could not be reached, broke off or took longer than `PROBE_SECONDS`.

        :param headers: What the probe carries besides asking for an uncompressed JSON answer (the caller's credential
            headers, and whatever else its API requires).
        """
        sent = {"Accept": "application/json", "Accept-Encoding": "identity", **headers}
        if data is not None:
            sent["Content-Type"] = "application/json"
        try:
            async with self._client().request(
                method, self.upstream + path, data=data, headers=sent, allow_redirects=False
            ) as response:
                self.reached = True
                payload = await read_bounded(response) if response.status == 200 else None
                return ProbeAnswer(response.status, response.headers, payload)
        except (aiohttp.ClientError, OSError, TimeoutError):
            self.reached = False
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
