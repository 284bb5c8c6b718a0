"""What a test scripts and observes on the simulated OpenAI upstream, apart from the model that answers.

`ScriptedServer` serves an aiohttp app on loopback and, around every route: records each request as received
(`requests`), applies scripted failures (`fail_next`: an error status, a dropped connection, a stream cut after
some chunks, a delay) and usage misreports (`misreport_usage_next`), renders `OpenAIError`s as OpenAI's bodies, and
sends Server-Sent Events one write each, counting streams begun, completed and aborted by the client.
`OpenAIUpstream` is the model on top of it.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Self

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.simulator.failures import Failure, RecordedRequest, drop_connection, failure_response, record
from proxy.simulator.openai_common import OpenAIError

__all__ = ["ScriptedServer"]

MAX_BODY_BYTES = 256 * 1024 * 1024

_CUT_AFTER_CHUNKS = web.RequestKey("cut_after_chunks", int)
"""Set on a request whose scripted failure cuts its stream after that many chunks."""


class ScriptedServer:
    """A loopback server whose requests are recorded and whose answers can be scripted to fail (module docstring).

    :param host: Interface to bind; loopback by default.
    :param port: Port to bind; 0 picks a free one (read `base_url` after `start()`).
    :param delay_first_byte: Seconds to wait before answering any request (a slow upstream).
    :param stream_chunk_delay: Seconds to wait between SSE chunks.
    :param cut_stream_after: If set, every stream is cut (connection reset) after this many chunks.

    Observations besides `requests`: `streams_started`, `streams_completed` and `streams_aborted` count streamed
    answers begun, sent whole, and broken off because the client (the proxy) went away mid-stream; `abort_event`
    is set on each abort, so a test can wait for the disconnect to reach the upstream.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        delay_first_byte: float = 0.0,
        stream_chunk_delay: float = 0.0,
        cut_stream_after: int | None = None,
    ) -> None:
        self.delay_first_byte = delay_first_byte
        self.stream_chunk_delay = stream_chunk_delay
        self.cut_stream_after = cut_stream_after
        self.streams_started = 0
        self.streams_completed = 0
        self.streams_aborted = 0
        self.abort_event = asyncio.Event()
        self.requests: list[RecordedRequest] = []
        self._host = host
        self._port = port
        self._failures: deque[Failure] = deque()
        self._misreports: deque[dict[str, int]] = deque()
        self._runner: web.AppRunner | None = None
        self._bound_port: int | None = None

    def add_routes(self, app: web.Application) -> None:
        """Add the model's routes to `app`; a subclass does."""
        raise NotImplementedError

    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[self._observe_and_inject])
        self.add_routes(app)
        return app

    # ---- lifecycle -------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind and start serving; afterwards `base_url` is set."""
        if self._runner is not None:
            raise RuntimeError(f"{type(self).__name__} is already started")
        runner = web.AppRunner(self._make_app(), access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port)
        await site.start()
        self._runner = runner
        self._bound_port = int(runner.addresses[0][1])

    async def close(self) -> None:
        """Stop serving and close every connection."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def port(self) -> int:
        """The port the server listens on."""
        if self._bound_port is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._bound_port

    @property
    def base_url(self) -> str:
        """`http://host:port`, without `/v1` (the OpenAI SDK's base_url is `base_url + "/v1"`)."""
        return f"http://{self._host}:{self.port}"

    def fail_next(
        self,
        status: int = 500,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        *,
        times: int = 1,
        reset: bool = False,
        cut_after_chunks: int | None = None,
        delay: float = 0.0,
    ) -> None:
        """Script the next `times` requests (of any route, in arrival order) to fail.

        By default each gets `status` with `body` (an OpenAI error body matching the status if None; a dict is sent
        as JSON, str/bytes as is) and `headers` (e.g. `{"retry-after": "2"}`). With `reset=True` the connection is
        dropped instead, with no response. With `cut_after_chunks=N` the request is served, but a streamed response
        is cut (connection reset) after N chunks. `delay` waits that many seconds first.
        """
        failure = Failure(
            status=status,
            body=body,
            headers=dict(headers or {}),
            reset=reset,
            cut_after_chunks=cut_after_chunks,
            delay=delay,
        )
        self._failures.extend([failure] * times)

    def misreport_usage_next(self, **usage: int) -> None:
        """Make the next chat completion or response answered report these `usage` fields instead of its counted ones.

        E.g. `misreport_usage_next(prompt_tokens=10**15, total_tokens=10**15)`: a broken or hostile provider's usage
        report, once; the request is served normally otherwise. Pending misreports are forgotten by `clear()`.
        """
        self._misreports.append(dict(usage))

    @web.middleware
    async def _observe_and_inject(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Record the request, apply scripted failures and delays, and render `OpenAIError`s."""
        body = await request.read()
        self.requests.append(record(request, body))
        failure = self._failures.popleft() if self._failures else None
        delay = self.delay_first_byte + (failure.delay if failure else 0.0)
        if delay:
            await asyncio.sleep(delay)
        if failure is not None:
            if failure.cut_after_chunks is not None:
                request[_CUT_AFTER_CHUNKS] = failure.cut_after_chunks
            elif failure.reset:
                drop_connection(request)
                return web.Response()
            else:
                return failure_response(failure)
        try:
            return await handler(request)
        except OpenAIError as error:
            return error.response()

    async def _send_events(
        self, request: web.Request, frames: Sequence[bytes], trailer: bytes, headers: Mapping[str, str]
    ) -> web.StreamResponse:
        """Send SSE `frames`, each its own write, then `trailer`; cut the connection if a fault says so.

        A client that goes away mid-stream (a write fails, or the handler is cancelled) counts in `streams_aborted`.
        """
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
        )
        for name, value in {**self._response_headers(), **headers}.items():
            response.headers[name] = value
        self.streams_started += 1
        cut_after = request.get(_CUT_AFTER_CHUNKS, self.cut_stream_after)
        try:
            await response.prepare(request)
            for sent, frame in enumerate(frames):
                if cut_after is not None and sent >= cut_after:
                    drop_connection(request)
                    return response
                if sent and self.stream_chunk_delay:
                    await asyncio.sleep(self.stream_chunk_delay)
                await response.write(frame)
            if trailer:
                await response.write(trailer)
            await response.write_eof()
        except ConnectionResetError:
            self._aborted()  # The client (or the proxy under test) went away mid-stream: nothing left to send to.
            return response
        except asyncio.CancelledError:
            self._aborted()
            raise
        self.streams_completed += 1
        return response

    def _aborted(self) -> None:
        self.streams_aborted += 1
        self.abort_event.set()

    def _response_headers(self) -> dict[str, str]:
        return {
            "x-request-id": f"req_{hashlib.sha256(str(len(self.requests)).encode()).hexdigest()[:32]}",
            "openai-processing-ms": "1",
            "openai-version": "2020-10-01",
        }
