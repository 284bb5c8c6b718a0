"""The compaction side of offloading: the chain that offloads, the texts it wrote persisted, the read tool offered.

Offloading runs inside `chain.compact`, synchronously and maybe on a worker thread, while the state store is
asynchronous: the strategy writes to a `StagingOffloadStore` made for the request, and once the compaction is done
the texts are persisted under the caller's tenant on the event loop, before anything is forwarded (a failure there
is a state-store failure like any other: the request is forwarded unchanged).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from proxy.chat.exchange import Api
from proxy.chat.metrics import CompactionMetrics
from proxy.config import Mode, Settings
from proxy.engine import CompactionChain
from proxy.engine.strategies.offload import StagingOffloadStore, ToolResultOffload
from proxy.engine.strategies.tool_result_pruning import ToolResultPruning
from proxy.offload.reads import ReadBack
from proxy.offload.tool import POINTER, held_references
from proxy.state import StateStore

OFFLOAD_HEADER: Final = "x-compaction-offload"
"""Request header: `off` compacts this request without offloading (plain pruning)."""

OFFLOADED_HEADER: Final = "X-Compaction-Offloaded"
"""Response header: how many offloaded results the forwarded conversation holds (and the read tool was offered)."""

LOSSY: Final = frozenset({ToolResultPruning.name, "sliding_window", "summarization", "middle_out"})
"""Strategies that lose content: offloading goes before the first of them (before `tool_result_pruning`)."""


class Offloading:
    """Offloading for the proxy's requests.

    :param settings: `offload`, `offload_read_rounds` and the mode.
    :param store: The state store offloaded texts are kept in.
    """

    def __init__(self, settings: Settings, store: StateStore) -> None:
        self.enabled = settings.offload and settings.mode is Mode.ENFORCE
        self.rounds = settings.offload_read_rounds
        self.store = store

    def staging(self, headers: Mapping[str, str]) -> StagingOffloadStore | None:
        """Where this request's compaction offloads to; None when offloading is off (setting, mode or header)."""
        if not self.enabled or headers.get(OFFLOAD_HEADER, "").strip().lower() == "off":
            return None
        return StagingOffloadStore()

    @staticmethod
    def chain(base: CompactionChain, staging: StagingOffloadStore | None) -> CompactionChain:
        """`base` with offloading to `staging` before its first lossy strategy; `base` itself when off."""
        if staging is None:
            return base
        strategies = list(base.strategies)
        at = next((i for i, strategy in enumerate(strategies) if strategy.name in LOSSY), len(strategies))
        strategies.insert(at, ToolResultOffload(staging, pointer=POINTER))
        return CompactionChain(strategies)

    async def persist(self, tenant: bytes, staging: StagingOffloadStore | None, metrics: CompactionMetrics) -> None:
        """Keep what the compaction offloaded, under the tenant, before the request that refers to it is forwarded."""
        pending = staging.pending() if staging is not None else {}
        if not pending:
            return
        await self.store.save_offloaded(tenant, pending)
        metrics.offloaded_results.inc(len(pending))
        held = getattr(self.store, "offloaded_bytes", None)
        if isinstance(held, int):
            metrics.offload_bytes.set(held)

    async def offered(
        self, tenant: bytes, api: Api, meta: Sequence[Mapping[str, Any]] | None, metrics: CompactionMetrics
    ) -> tuple[ReadBack, dict[str, str]] | None:
        """The reads to answer and headers to add for messages with this metadata; None when they hold no offload.

        The texts they refer to live on as long as the conversation: each request holding them refreshes them.
        """
        references = held_references(meta)
        if not references:
            return None
        await self.store.touch_offloaded(tenant, references)
        headers = {OFFLOADED_HEADER: str(len(references)), "X-Compaction-Reads": "0"}
        return ReadBack(tenant, self.store, api, self.rounds, metrics), headers
