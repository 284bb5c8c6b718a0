"""The event loop the proxy runs on: uvloop when it is installed (the `speed` extra), else asyncio's own.

uvloop (libuv under asyncio's interface) does the same work as asyncio's loop in less CPU per socket read, write and
callback: at the proxy's fixed cost per small request that is a fifth or more of its requests per second
(docs/benchmarks.md). It changes no behaviour the proxy relies on, so it is used whenever it can be imported, and
`event_loop: asyncio` keeps asyncio's loop (to compare, or where uvloop will not build).
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable
from typing import Final, Literal

EventLoopName = Literal["auto", "asyncio", "uvloop"]
LOOPS: Final = ("auto", "asyncio", "uvloop")
"""What `event_loop` may say: `auto` is uvloop when installed, else asyncio."""


class EventLoopUnavailable(RuntimeError):
    """`event_loop: uvloop` was asked for but uvloop is not installed."""


def loop_factory(name: str = "auto") -> tuple[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The loop `name` stands for, as (the name of the loop it is, a factory for it).

    :raises EventLoopUnavailable: `name` is `uvloop` and uvloop cannot be imported.
    """
    if name == "asyncio":
        return "asyncio", asyncio.new_event_loop
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError as exc:
        if name == "uvloop":
            raise EventLoopUnavailable(
                "event_loop is uvloop but uvloop is not installed: install the proxy with its `speed` extra"
                " (pip install 'compaction-proxy[speed]') or set event_loop to auto or asyncio"
            ) from exc
        return "asyncio", asyncio.new_event_loop
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return "uvloop", factory


def new_event_loop(name: str = "auto") -> asyncio.AbstractEventLoop:
    """A new loop of the kind `name` stands for (see `loop_factory`)."""
    return loop_factory(name)[1]()
