"""One request of a conversation as the pipeline works on it, and what it reuses of the conversation's last one.

A format that recognizes a conversation's next request from its bytes (`proxy.pipeline.capabilities.ByteSplicing`)
hands the pipeline a `Continuation`: the request, and what was remembered of the last one. The pipeline then works
on the new messages only: hashing them, extending the remembered view, reusing the token counts made for it and
the anchor's place. Every other request's `Turn` has no continuation, and its work is the whole request's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from proxy.engine import Anchor
from proxy.engine.messages import Message
from proxy.engine.transcript import Counts
from proxy.pipeline.off_loop import OffLoop
from proxy.pipeline.rewrites import Keyed, RewriteMemory, View
from proxy.pipeline.usage import UsageReports


class Remembered(Protocol):
    """What the pipeline made of a conversation's last request, kept for its next one (see the `Turn` fields)."""

    @property
    def keyed(self) -> Keyed | None:
        """Its messages' keys and chain."""
        ...

    @property
    def view(self) -> View | None:
        """The upstream's view it was decided on, when no compaction changed it."""
        ...

    @property
    def counted(self) -> Counts | None:
        """The view's token counts made for the decision."""
        ...

    @property
    def anchored_at(self) -> int | None:
        """Where the usage anchor of what was sent was found."""
        ...

    @property
    def forwarded(self) -> Any:
        """The format's own record of the body it sent (`Turn.forwarded`)."""
        ...


class Continuation(Protocol):
    """A request recognized as a remembered one plus new messages (none when re-sent as it was)."""

    @property
    def previous(self) -> Remembered:
        """The remembered request."""
        ...

    @property
    def request(self) -> Any:
        """The request, exactly as parsing its whole body gives it (a `WireRequest`)."""
        ...

    @property
    def added_bytes(self) -> int:
        """What the request added to the remembered one, in bytes."""
        ...


@dataclass
class Turn:
    """What the proxy makes of one request while handling it: what the next request of the conversation reuses.

    :param extension: How the request extends the conversation's last one, when it was recognized from its bytes.
    :param keyed: Its messages' keys and chain.
    :param view: The upstream's view it was decided on, when no compaction changed it.
    :param counted: The view's token counts made for the decision.
    :param forwarded: What the format recorded of the body it serialized (`ByteSplicing.forward`), if anything.
    :param anchored_at: Where the usage anchor of what was sent was found.
    """

    extension: Continuation | None = None
    keyed: Keyed | None = None
    view: View | None = None
    counted: Counts | None = None
    forwarded: Any = None
    anchored_at: int | None = None

    async def anchored(self, usage: UsageReports, scope: bytes, chain: list[bytes]) -> Anchor | None:
        """The usage anchor of what is sent (`chain`), looked up from where the last request's was found."""
        anchor = await usage.anchor(scope, chain, self.extension.previous.anchored_at if self.extension else None)
        self.anchored_at = anchor.covered - 1 if anchor else None
        return anchor

    def new_bytes(self, size: int) -> int:
        """What the request added to the one it extends, in bytes: all its `size` when it extends none."""
        return self.extension.added_bytes if self.extension else size

    async def replayed(
        self, rewrites: RewriteMemory, scope: bytes, messages: list[Message], size: int, off_loop: OffLoop
    ) -> View:
        """The request's messages with the remembered rewrite replayed (see `RewriteMemory`).

        When the request extends a known one, only its new messages are hashed, the known view is extended and the
        counts made for it are reused (in `counted`); otherwise the work is the whole request's.
        """
        previous = self.extension.previous if self.extension else None
        if previous is not None and previous.keyed is not None:
            keyed = previous.keyed.extended(messages, size)
        else:
            keyed = await off_loop.run(size, lambda: rewrites.keyed(scope, messages, size))
        self.keyed = keyed
        found = await rewrites.find(scope, keyed, previous.keyed if previous else None)
        plan = found[1] if found else None
        view = rewrites.extended_view(previous.view, keyed, plan) if previous and previous.view else None
        if view is None:
            return await off_loop.run(size, lambda: rewrites.view(scope, keyed, plan))
        if previous is not None and previous.counted is not None:
            self.counted = previous.counted.extended(len(view.messages))
        return view
