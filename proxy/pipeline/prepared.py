"""What the compaction side learned while preparing a request, handed back with the upstream's answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from proxy.pipeline.ledger import Opening
from proxy.pipeline.off_loop import OFF_LOOP_BYTES
from proxy.pipeline.turn import Turn
from proxy.pipeline.usage import Estimate
from proxy.pipeline.wire import WireFormat, WireRequest

RELEASE_FROM_BYTES: Final = OFF_LOOP_BYTES
"""Requests of a format that splices (`ByteSplicing`) from this size let go of their parsed messages while the
upstream answers (`Prepared.release`): parsed, a body takes about 1.4 times its size again, held for as long as the
answer takes."""


@dataclass(slots=True)
class Prepared:
    """What `prepare` learned about a request, handed back to `complete` through `ForwardPlan.context`.

    :param scope: The state scope (tenant, window override, wire format).
    :param tenant: The caller's tenant.
    :param parsed: The parsed request, None once `release`d.
    :param model: The model asked for (or the Azure deployment).
    :param window: The window the decision used, if one was known.
    :param size: The request body's size in bytes.
    :param wire: The request's wire format.
    :param chain: The hash chain of the messages sent upstream.
    :param estimate: The proxy's estimate of what was sent.
    :param retried: This is the compacted retry after a context overflow.
    :param provider_state: The history lives at the provider (see `proxy.pipeline.capabilities.ProviderHistory`).
    :param headers: The report headers for the client.
    :param turn: What the byte-level shortcut knows of the request (see `proxy.pipeline.turn`).
    :param offload_off: The request turned offloading off (`X-Compaction-Offload: off`).
    :param raw: The client's body, kept by `release` to parse again.
    :param provider_edited: The request asks the provider to edit it on its side: its usage report counts what the
        provider processed, not what was sent (`proxy.pipeline.provider_edits`).
    :param original: The hash chain of the client's messages (empty when not computed): what the conversation's next
        request finds this one's `Forwarding.replay_state` by.
    :param opening: The request as the ledger was told of it (`proxy.pipeline.ledger_entries`), None when not.
    """

    scope: bytes
    tenant: bytes
    parsed: WireRequest | None
    model: str | None
    window: int | None
    size: int
    wire: WireFormat
    chain: list[bytes] = field(default_factory=list)
    estimate: Estimate | None = None
    retried: bool = False
    provider_state: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    turn: Turn = field(default_factory=Turn)
    offload_off: bool = False
    raw: bytes = b""
    original: list[bytes] = field(default_factory=list)
    provider_edited: bool = False
    opening: Opening | None = None

    @property
    def request(self) -> WireRequest:
        """The parsed request (see `release`)."""
        if self.parsed is None:
            raise RuntimeError("The parsed request was released; parse `raw` again.")
        return self.parsed

    def release(self, raw: bytes) -> None:
        """Let go of the parsed request and of what the shortcut made of it while the upstream answers.

        A large request's parsed messages take more memory than its body, and only a retry after a context overflow
        needs them again: it parses `raw` anew, and takes the full path from there.
        """
        self.raw, self.parsed, self.turn = raw, None, Turn()
