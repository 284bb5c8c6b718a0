"""The start and stop every fake upstream shares: its aiohttp app served on 127.0.0.1, on a port the OS picks."""

from __future__ import annotations

from typing import Self

from aiohttp import web


class LoopbackServer:
    """A base for a fake upstream: `async with` serves `make_app()` on loopback; `base_url` says where.

    A subclass builds its routes in `make_app`; starting, the port and stopping (every connection closed within a
    second) are here, once.
    """

    _runner: web.AppRunner | None = None
    _port: int | None = None

    def make_app(self) -> web.Application:
        """The application to serve; a subclass adds its routes."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        self._runner = web.AppRunner(self.make_app(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self._port = int(self._runner.addresses[0][1])
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:<port>`, without `/v1`: the proxy's `upstream` setting (and the `anthropic` SDK's)."""
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} is not started: use it in `async with`")
        return f"http://127.0.0.1:{self._port}"
