"""The idle timeout of an upstream answer's body: one timer per idle period, not one per read.

An answer streamed token by token is read in hundreds of small pieces; wrapping each read in `asyncio.timeout` costs
a timeout object and a timer each (a few microseconds, as much as a piece's own relay). The watch keeps one timer and
moves a deadline instead: each read sets the deadline to its start plus `idle_timeout`, and the timer, when it fires,
either finds the deadline moved (and waits for it) or the read still waiting past it, which it fails. A read
therefore fails exactly when it waited `idle_timeout` without a byte, as with a timeout around each read; time spent
between reads (writing to a slow client) never counts.
"""

from __future__ import annotations

import asyncio

import aiohttp


class IdleTimedOut(Exception):
    """A read of the answer waited past the idle timeout."""


class IdleWatch:
    """Reads of one answer's body, each failing with `IdleTimedOut` when it waits longer than `idle` seconds.

    :param content: The answer's body stream.
    :param idle: Seconds a read may wait for its first byte.
    """

    def __init__(self, content: aiohttp.StreamReader, idle: float) -> None:
        self._content = content
        self._idle = idle
        self._loop = asyncio.get_running_loop()
        self._deadline = 0.0
        self._reading = False
        self._timer: asyncio.TimerHandle | None = None

    async def read(self, size: int) -> bytes:
        """Up to `size` bytes of the body as they arrive (b"" at its end).

        :raises IdleTimedOut: Nothing arrived for `idle` seconds.
        """
        self._deadline = self._loop.time() + self._idle
        if self._timer is None:
            self._timer = self._loop.call_at(self._deadline, self._check)
        self._reading = True
        try:
            return await self._content.read(size)
        finally:
            self._reading = False

    def _check(self) -> None:
        self._timer = None
        if not self._reading:
            return  # the next read arms the timer again
        if self._loop.time() < self._deadline:
            self._timer = self._loop.call_at(self._deadline, self._check)
            return
        self._content.set_exception(IdleTimedOut())

    def close(self) -> None:
        """Stop the timer: the answer is done with."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
