"""The compaction side of offloading: the chain that offloads, the texts it wrote persisted, the read tool offered.

Offloading runs inside `chain.compact`, synchronously and maybe on a worker thread, while the state store is
asynchronous: the strategy writes to a `StagingOffloadStore` made for the request, and once the compaction is done
the texts are persisted under the caller's tenant on the event loop, before anything is forwarded (a failure there
is a state-store failure like any other: the request is forwarded unchanged).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final

from xxhash import xxh3_128_digest

from proxy.config import Settings
from proxy.engine import CompactionChain, Thresholds
from proxy.engine.counting import counter_for_model
from proxy.engine.messages import Message
from proxy.engine.strategies.chain import KeepingMore
from proxy.engine.strategies.middle_out import MiddleOut
from proxy.engine.strategies.offload import StagingOffloadStore, ToolResultOffload, held_references
from proxy.engine.strategies.sliding_window import SlidingWindow
from proxy.engine.strategies.summarization import Summarization
from proxy.engine.strategies.tool_result_pruning import ToolResultPruning
from proxy.engine.strategies.user_message_window import UserMessageWindow
from proxy.engine.transcript import Transcript
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.offload.reads import ReadBack, ReadLimits
from proxy.pipeline.offload.reserving import ReadToolRoom
from proxy.pipeline.offload.tool import (
    POINTER,
    USER_POINTER,
    R,
    as_forwarded,
    offer_declined,
    read_tool_tokens,
)
from proxy.pipeline.wire import WireFormat, WireRequest
from proxy.state import StateStore
from proxy.state.base import OFFLOAD_REFRESH_SHARE

OFFLOAD_HEADER: Final = "x-compaction-offload"
"""Request header: `off` compacts this request without offloading (plain pruning)."""

OFFLOADED_HEADER: Final = "X-Compaction-Offloaded"
"""Response header: how many offloaded results the forwarded conversation holds (and the read tool was offered)."""

REFRESHES_REMEMBERED: Final = 10_000
"""Sets of offloaded results whose last refresh is remembered (one per conversation holding any, about)."""

LOSSY: Final = frozenset(
    {ToolResultPruning.name, UserMessageWindow.name, SlidingWindow.name, Summarization.name, MiddleOut.name}
)
"""Strategies that lose content: offloading goes before the first of them (before `tool_result_pruning`), unless the
configured chain names `tool_result_offloading` where it should run."""


def offload_position(strategies: Sequence[str], chain: Sequence[str]) -> int | None:
    """Where in `chain` (the names the proxy's chain runs) the configured `strategies` place offloading, if they do.

    Offloading goes after every step named before it that the chain runs (summarization is the proxy's own step,
    before the chain, so it places nothing).
    """
    if ToolResultOffload.name not in strategies:
        return None
    before = strategies[: list(strategies).index(ToolResultOffload.name)]
    return sum(1 for name in before if name in chain)


def offload_off(headers: Mapping[str, str]) -> bool:
    """Whether the request's headers (lower-cased names) turn offloading off for it."""
    return headers.get(OFFLOAD_HEADER, "").strip().lower() == "off"


class Offloading:
    """Offloading for the proxy's requests.

    :param settings: `offload`, its `offload_*` bounds and `max_body_bytes`. Observe mode offloads too, to a staging
        store that is never persisted, so that it reports the decision enforce mode makes.
    :param store: The state store offloaded texts are kept in.
    :param base: The proxy's chain, which offloading joins.
    :param metrics: The service's metrics now (they move to the app's registry once it exists).
    :param clock: Monotonic seconds, for when the results a conversation holds were last refreshed.
    """

    def __init__(
        self,
        settings: Settings,
        store: StateStore,
        base: CompactionChain,
        metrics: Callable[[], CompactionMetrics],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = settings.offload
        self.settings = settings
        self.store = store
        self.base = base
        self.metrics = metrics
        self.position = offload_position(settings.strategies, [strategy.name for strategy in base.strategies])
        self.refresh_every = settings.state_ttl_seconds * OFFLOAD_REFRESH_SHARE
        self.clock = clock
        self._refreshed: OrderedDict[bytes, float] = OrderedDict()

    def declined(self, request: WireRequest) -> bool:
        """Whether the read tool cannot be offered to this request (`proxy.pipeline.offload.tool.offer_declined`)."""
        return offer_declined(request, self.settings.offload_max_tools) is not None

    def counted(self, request: R, wire: WireFormat, kept: bool) -> R:
        """The request whose tools are counted: with the read tool when its conversation keeps it (see `offer`).

        Its tokens are then part of the request's overhead, like the client's own tools, and every compaction of
        the conversation aims under the target with them.
        """
        return as_forwarded(request, wire.read_tool, kept, self.settings.offload_max_tools)

    def for_request(
        self, request: WireRequest, wire: WireFormat, off: bool, *, kept: bool = False
    ) -> tuple[StagingOffloadStore | None, CompactionChain]:
        """Where a request's compaction offloads to, and its chain: offloading to it before the first lossy strategy.

        The user message window offloads there too: a user message it must set aside leaves a reference, and a
        compaction that does so aims under the target by what the read tool adds to the request (`read_tool_tokens`).
        So does one whose offloaded results bring the tool (`ReadToolRoom`), unless the conversation keeps the tool
        already (`kept`): then it is counted with the request's tools (`counted`).

        :param off: No offloading for this request: it turned it off (`offload_off`), or it is not being compacted.
            The setting can turn it off too, and so can a request the read tool cannot be offered to (counted):
            then there is no staging store and the chain is the proxy's, which prunes.

        The chain with offloading gives way to the proxy's own where that keeps more of the conversation
        (`KeepingMore`): a reference with its digest frees less than pruning's placeholder, and in a small window
        offloading must never cost whole turns that pruning would have kept.
        """
        if not self.enabled or off:
            return None, self.base
        reason = offer_declined(request, self.settings.offload_max_tools)
        if reason is not None:
            self.metrics().offload_declined.labels(reason).inc()
            return None, self.base
        staging = StagingOffloadStore()
        reserved = 0 if kept else read_tool_tokens(request, wire, self.settings.offload_max_tools)
        strategies = [
            strategy.offloading_to(staging, USER_POINTER, reserved)
            if isinstance(strategy, UserMessageWindow)
            else strategy
            for strategy in self.base.strategies
        ]
        at = self.position
        if at is None:
            at = next((i for i, strategy in enumerate(strategies) if strategy.name in LOSSY), len(strategies))
        strategies.insert(at, ToolResultOffload(staging, pointer=POINTER, with_digest=True))
        preferred = CompactionChain(strategies)
        return staging, KeepingMore(ReadToolRoom(preferred, reserved) if reserved else preferred, self.base)

    async def persist(self, tenant: bytes, staging: StagingOffloadStore | None, compacted: Transcript) -> None:
        """Keep what the compaction offloaded and the `compacted` conversation still refers to, under the tenant.

        Persisted before the request that refers to it is forwarded. A text offloaded and then dropped with its turn
        by a later strategy (or by a chain not taken) is not kept: nothing can ask for it.
        """
        pending = staging.pending() if staging is not None else {}
        if pending:
            referred = set(held_references(compacted.meta))
            pending = {reference: text for reference, text in pending.items() if reference in referred}
        if not pending:
            return
        await self.store.save_offloaded(tenant, pending)
        metrics = self.metrics()
        metrics.offloaded_results.inc(len(pending))
        held = getattr(self.store, "offloaded_bytes", None)
        if isinstance(held, int):
            metrics.offload_bytes.set(held)

    async def offer(
        self,
        request: R,
        wire: WireFormat,
        tenant: bytes,
        held: tuple[str, ...],
        headers: dict[str, str],
        *,
        kept: bool = False,
        sized: tuple[int | None, int | None] = (None, None),
        originals: Callable[[], Awaitable[Sequence[Message]]] | None = None,
    ) -> tuple[R, ReadBack | None]:
        """The request to forward holding these offloaded results, and the reads to answer for it.

        When it holds any, the request gets the read tool and `headers` say so; the texts live on as long as the
        conversation (see `refresh`), and one the store no longer holds is read from `originals`, the client's
        messages, and stored again (see `proxy.pipeline.offload.reads`). A conversation once sent with the tool
        (`kept`) keeps it, byte for byte the same, when a compaction has left no reference: its tools, which every
        provider's prompt cache orders first, do not change, and a read of a reference no longer held is answered
        that it is not. Otherwise, or when the read tool cannot be offered to it (a later turn whose client tools
        changed), the request is returned as it is, with no reads: every call reaches the client.

        :param kept: The conversation was sent with the read tool before (`proxy.pipeline.rewrites.View.read_tool`).
        :param sized: The request's window and estimated prompt tokens, when known: the rounds stay within them.
        """
        if not (held or kept) or self.declined(request):
            return request, None
        if held:
            await self.refresh(tenant, held)
        window, tokens = sized
        settings = self.settings
        room = (
            Thresholds(window, settings.compact_at, settings.compact_to, request.reserved_tokens).room
            if window
            else None
        )
        limits = ReadLimits(
            settings.offload_read_rounds, settings.offload_reads_per_answer, settings.max_body_bytes, room
        )
        back = ReadBack(
            tenant,
            self.store,
            wire,
            limits,
            self.metrics(),
            counter=counter_for_model(request.model),
            tokens=tokens,
            held=frozenset(held),
            originals=originals,
        )
        headers.update({OFFLOADED_HEADER: str(len(held)), **back.report()})
        return self.counted(request, wire, True), back

    async def refresh(self, tenant: bytes, held: tuple[str, ...]) -> None:
        """Restart the time to live of the results a request holds, unless this process did so recently.

        A conversation re-sends the same results every turn; refreshing thousands of them on every request would cost
        work proportional to the whole conversation. They are refreshed at most once per `refresh_every` seconds
        instead, and the store keeps them that much longer than the rest (`proxy.state.base.offload_ttl`), so they
        still outlive the conversation's other state.
        """
        # A digest, not the references: remembered for many conversations, they would hold thousands of strings each.
        key, now = tenant + xxh3_128_digest("\n".join(held).encode()), self.clock()
        last = self._refreshed.get(key)
        if last is not None and now - last < self.refresh_every:
            return
        await self.store.touch_offloaded(tenant, held)
        self._refreshed[key] = now
        self._refreshed.move_to_end(key)
        if len(self._refreshed) > REFRESHES_REMEMBERED:
            self._refreshed.popitem(last=False)
