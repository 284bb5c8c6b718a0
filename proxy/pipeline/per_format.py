"""What the pipeline keeps per wire format, made on the format's first request: the pipeline imports no format."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from proxy.pipeline.wire import WireFormat

T = TypeVar("T")


class PerFormat(Generic[T]):
    """One `T` per wire format (None for a format without it), made by `make` when the format is first asked about.

    :param make: What a format gets (None when its `WireFormat` declares no such capability).
    """

    def __init__(self, make: Callable[[WireFormat], T | None]) -> None:
        self._make = make
        self._made: dict[str, T | None] = {}

    def of(self, wire: WireFormat) -> T | None:
        """The format's own, made now if it was not yet."""
        if wire.name not in self._made:
            self._made[wire.name] = self._make(wire)
        return self._made[wire.name]

    def made(self) -> Iterator[T]:
        """Every one made so far."""
        return (made for made in self._made.values() if made is not None)
