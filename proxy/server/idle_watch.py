"""The idle timeout of an upstream answer's body: one timer for the answer's life, a deadline stored per read.

An answer streamed token by token is read in hundreds of small pieces; wrapping each read in `asyncio.timeout` costs
a timeout object and a timer each (a few microseconds, as much as a piece's own relay), and even a watch armed per
read costs a call and a frame. The watch keeps one timer and a deadline the reader moves instead: before each read
it stores the read's start plus `idle` (`IdleWatch.deadline`), after it `BETWEEN_READS`. The timer, when it fires,
either finds the deadline moved or unset (and looks again when it is due, or after `idle` seconds) or the read still
waiting past it, which it fails. A read therefore fails exactly when it waited `idle` seconds without a byte, as with
a timeout around each read; time spent between reads (writing to a slow client) never counts. The clock is
`time.monotonic`, which asyncio's loop time is.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Final

import aiohttp

BETWEEN_READS: Final = math.inf
"""The deadline while no read waits: nothing to fail."""


class IdleTimedOut(Exception):
    """A read of the answer waited past the idle timeout."""


class IdleWatch:
    """Fails the read of one answer's body (with `IdleTimedOut`) that waits longer than `idle` seconds.

    The reader keeps `deadline`: `time.monotonic()` + `idle` when a read starts, `BETWEEN_READS` once it returned.

    :param content: The answer's body stream.
    :param idle: Seconds a read may wait for its first byte.
    """

    __slots__ = ("_content", "_idle", "_loop", "_timer", "deadline")

    def __init__(self, content: aiohttp.StreamReader, idle: float) -> None:
        self._content = content
        self._idle = idle
        self._loop = asyncio.get_running_loop()
        self.deadline = BETWEEN_READS
        self._timer: asyncio.TimerHandle | None = self._loop.call_at(time.monotonic() + idle, self._check)

    def _check(self) -> None:
        now = time.monotonic()
        if now < self.deadline:  # no read waits, or the one waiting is not due yet
            self._timer = self._loop.call_at(min(self.deadline, now + self._idle), self._check)
            return
        self._timer = None
        self._content.set_exception(IdleTimedOut())

    def close(self) -> None:
        """Stop the timer: the answer is done with."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
