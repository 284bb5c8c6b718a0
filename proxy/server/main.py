"""Running the proxy as a process: listen, serve until SIGTERM or SIGINT, then shut down gracefully and return."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from typing import Final

from aiohttp import web

from proxy import __version__
from proxy.config import Settings
from proxy.config.kinds import EventLoop
from proxy.pipeline.exchange import Compaction
from proxy.server.app import create_app, runner_options
from proxy.server.connections import CappedListener, default_max_connections
from proxy.server.event_loop import loop_factory
from proxy.server.keys import COMPACTION, READINESS
from proxy.server.logging import SERVER_LOGGER, configure_logging, flush_logging
from proxy.server.readiness import unready_reason

log = logging.getLogger(SERVER_LOGGER)

COLLECTOR_THRESHOLDS: Final = (20_000, 50, 100)
"""The garbage collector's thresholds while serving (Python's defaults: 700, 10, 10). Every request allocates a few
hundred containers that die with it, so the defaults collect the young generation every few requests; these cut the
proxy's CPU per small request by about 12% (453-499 against 394-429 us, 64 in flight, 4 interleaved runs), and the
cyclic garbage that waits longer for a collection is a few requests' worth."""


def serve(settings: Settings, compaction: Compaction | None = None, *, worker: int | None = None) -> None:
    """Run the proxy in the foreground until SIGTERM/SIGINT; return once shut down.

    On the signal the proxy reports not-ready, stops accepting connections, gives in-flight requests and streams up to
    `shutdown_grace_seconds` to finish, cancels what is left, closes the upstream client and returns.

    :param worker: Which of `settings.workers` processes this is (see `proxy.server.workers`); None for the only one.
    :raises OSError: The address could not be bound.
    """
    configure_logging(settings, worker, deferred=True)
    gc.set_threshold(*COLLECTOR_THRESHOLDS)
    event_loop, factory = loop_factory(settings.event_loop)
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(serve_async(settings, compaction, event_loop=event_loop))
    finally:
        flush_logging()


async def serve_async(
    settings: Settings, compaction: Compaction | None = None, *, event_loop: EventLoop = EventLoop.ASYNCIO
) -> None:
    """The coroutine behind `serve`, for callers that run their own event loop.

    The app listens through a `CappedListener` (at most `max_connections` client connections) instead of an aiohttp
    site; the runner still owns the app's lifecycle and the graceful shutdown of open connections.

    :param event_loop: The kind of loop it runs on, for the `listening` line (`serve` chooses it).
    """
    app = create_app(settings, compaction)
    runner = web.AppRunner(app, handle_signals=False, **runner_options(settings))
    await runner.setup()
    assert runner.server is not None  # set by setup()
    listener = CappedListener(runner.server, settings.max_connections or default_max_connections())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await listener.start(settings.host, settings.port, reuse_port=settings.workers > 1)
        log.info(
            "listening",
            extra={
                "fields": {
                    "version": __version__,
                    "addresses": listener.addresses,
                    "upstream": settings.upstream,
                    "routes": {route.name: route.upstream for route in settings.route_table()},
                    "mode": settings.mode.value,
                    "state_store": settings.state_url.split(":", 1)[0],
                    "strategies": ",".join(settings.strategies),
                    "offload": settings.offload,
                    "max_connections": listener.limit,
                    "pid": os.getpid(),
                    "event_loop": event_loop.value,
                }
            },
        )
        await _warn_about_state(settings, app)
        await stop.wait()
        app[READINESS].stopping()
        log.info("shutting down", extra={"fields": {"grace_seconds": settings.shutdown_grace_seconds}})
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        listener.close()
        await runner.cleanup()
    log.info("stopped")


async def _warn_about_state(settings: Settings, app: web.Application) -> None:
    """One WARNING each for a shared state store without a tenant key and for a store that does not answer."""
    shared = not settings.state_url.startswith("memory://")
    if shared and "tenant_key" not in settings.model_fields_set:
        log.warning(
            "state_url names a shared store but tenant_key is not set: this process keys state with a random key, so"
            " replicas will not share conversations. Set COMPACTION_PROXY_TENANT_KEY to the same secret everywhere."
        )
    if await unready_reason(app[COMPACTION]) == "state_store_unreachable":
        log.warning(
            "The state store does not answer: requests are forwarded uncompacted and /readyz answers degraded until"
            " it does. Check state_url and that Redis is up and reachable from here."
        )
