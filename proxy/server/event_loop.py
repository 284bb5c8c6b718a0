"""The event loop the proxy runs on: uvloop when it is installed (the `speed` extra), else asyncio's own.

uvloop (libuv under asyncio's interface) does the same work as asyncio's loop in less CPU per socket read, write and
callback (docs/benchmarks.md has the proxy's requests per second on both). It changes no behaviour the proxy relies
on, so `event_loop: auto` uses it whenever it can be imported; `asyncio` keeps asyncio's loop (to compare, or where
uvloop will not build) and `uvloop` refuses to start without it.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable

from proxy.config.kinds import EventLoop

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


class EventLoopUnavailable(RuntimeError):
    """`event_loop: uvloop` was asked for but uvloop is not installed."""


def loop_factory(choice: EventLoop | str = EventLoop.AUTO) -> tuple[EventLoop, LoopFactory]:
    """The loop `choice` stands for: (`EventLoop.ASYNCIO` or `EventLoop.UVLOOP`, a factory of such loops).

    :raises EventLoopUnavailable: `choice` is uvloop and uvloop cannot be imported.
    """
    if choice == EventLoop.ASYNCIO:
        return EventLoop.ASYNCIO, asyncio.new_event_loop
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError as exc:
        if choice == EventLoop.UVLOOP:
            raise EventLoopUnavailable(
                "event_loop is uvloop but uvloop is not installed: install the proxy with its `speed` extra"
                " (pip install 'compaction-proxy[speed]'), or set event_loop to auto or asyncio"
            ) from exc
        return EventLoop.ASYNCIO, asyncio.new_event_loop
    factory: LoopFactory = uvloop.new_event_loop
    return EventLoop.UVLOOP, factory


def new_event_loop(choice: EventLoop | str = EventLoop.AUTO) -> asyncio.AbstractEventLoop:
    """A new loop of the kind `choice` stands for (see `loop_factory`)."""
    return loop_factory(choice)[1]()
