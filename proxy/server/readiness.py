"""The proxy's readiness: ready once started, not ready again as soon as it begins to shut down."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Readiness:
    """A flag `/readyz` reports; flipped by the app's startup and shutdown signals and by the SIGTERM handler."""

    ready: bool = False
    shutting_down: bool = False

    def started(self) -> None:
        """The upstream client is up: take traffic."""
        if not self.shutting_down:
            self.ready = True

    def stopping(self) -> None:
        """Shutdown began: tell load balancers to stop routing here while in-flight requests finish."""
        self.shutting_down = True
        self.ready = False
