"""Running the proxy as a process: listen, serve until SIGTERM or SIGINT, then shut down gracefully and return."""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from proxy.chat.exchange import ChatCompaction
from proxy.config import Settings
from proxy.server.app import create_app, runner_options
from proxy.server.connections import CappedListener, default_max_connections
from proxy.server.keys import READINESS
from proxy.server.logging import SERVER_LOGGER, configure_logging

log = logging.getLogger(SERVER_LOGGER)


def serve(settings: Settings, chat: ChatCompaction | None = None) -> None:
    """Run the proxy in the foreground until SIGTERM/SIGINT; return once shut down.

    On the signal the proxy reports not-ready, stops accepting connections, gives in-flight requests and streams up to
    `shutdown_grace_seconds` to finish, cancels what is left, closes the upstream client and returns.

    :raises OSError: The address could not be bound.
    """
    configure_logging(settings)
    asyncio.run(serve_async(settings, chat))


async def serve_async(settings: Settings, chat: ChatCompaction | None = None) -> None:
    """The coroutine behind `serve`, for callers that run their own event loop.

    The app listens through a `CappedListener` (at most `max_connections` client connections) instead of an aiohttp
    site; the runner still owns the app's lifecycle and the graceful shutdown of open connections.
    """
    app = create_app(settings, chat)
    runner = web.AppRunner(app, handle_signals=False, **runner_options(settings))
    await runner.setup()
    assert runner.server is not None  # set by setup()
    listener = CappedListener(runner.server, settings.max_connections or default_max_connections())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await listener.start(settings.host, settings.port)
        log.info(
            "listening",
            extra={
                "fields": {
                    "addresses": listener.addresses,
                    "upstream": settings.upstream,
                    "mode": settings.mode.value,
                    "max_connections": listener.limit,
                }
            },
        )
        await stop.wait()
        app[READINESS].stopping()
        log.info("shutting down", extra={"fields": {"grace_seconds": settings.shutdown_grace_seconds}})
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        listener.close()
        await runner.cleanup()
    log.info("stopped")
