"""The proxy's readiness: ready once started and not once shutdown begins; degraded while compaction cannot work."""

from __future__ import annotations

from dataclasses import dataclass


async def unready_reason(chat: object) -> str | None:
    """What keeps the compaction side from working (its optional `unready_reason()`, e.g. Redis down), or None.

    Requests are still forwarded meanwhile (uncompacted), so this degrades readiness without revoking it.
    """
    probe = getattr(chat, "unready_reason", None)
    reason: str | None = await probe() if callable(probe) else None
    return reason


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
