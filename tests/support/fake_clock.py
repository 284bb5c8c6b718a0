"""A clock a test moves by hand: shared by the proxy's ledger and a fake upstream's prompt cache, never the wall's."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FakeClock:
    """Seconds that pass only when `advance` says so."""

    now: float = 1_000_000.0

    def __call__(self) -> float:
        """The time now."""
        return self.now

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass."""
        self.now += seconds
