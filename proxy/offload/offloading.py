"""The compaction side of offloading: the chain that offloads, the texts it wrote persisted, the read tool offered.

Offloading runs inside `chain.compact`, synchronously and maybe on a worker thread, while the state store is
asynchronous: the strategy writes to a `StagingOffloadStore` made for the request, and once the compaction is done
the texts are persisted under the caller's tenant on the event loop, before anything is forwarded (a failure there
is a state-store failure like any other: the request is forwarded unchanged).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from proxy.chat.exchange import Api
from proxy.chat.metrics import CompactionMetrics
from proxy.chat.request import ChatRequest
from proxy.config import Mode, Settings
from proxy.engine import CompactionChain
from proxy.engine.strategies.middle_out import MiddleOut
from proxy.engine.strategies.offload import StagingOffloadStore, ToolResultOffload
from proxy.engine.strategies.sliding_window import SlidingWindow
from proxy.engine.strategies.summarization import Summarization
from proxy.engine.strategies.tool_result_pruning import ToolResultPruning
from proxy.offload.reads import ReadBack
from proxy.offload.tool import POINTER, held_references, with_read_tool
from proxy.responses.request import ResponsesRequest
from proxy.state import StateStore

OFFLOAD_HEADER: Final = "x-compaction-offload"
"""Request header: `off` compacts this request without offloading (plain pruning)."""

OFFLOADED_HEADER: Final = "X-Compaction-Offloaded"
"""Response header: how many offloaded results the forwarded conversation holds (and the read tool was offered)."""

READS_HEADER: Final = "X-Compaction-Reads"
"""Response header: how many reads of offloaded results the proxy answered for this request."""

LOSSY: Final = frozenset({ToolResultPruning.name, SlidingWindow.name, Summarization.name, MiddleOut.name})
"""Strategies that lose content: offloading goes before the first of them (before `tool_result_pruning`)."""


def offload_off(headers: Mapping[str, str]) -> bool:
    """Whether the request's headers (lower-cased names) turn offloading off for it."""
    return headers.get(OFFLOAD_HEADER, "").strip().lower() == "off"


class Offloading:
    """Offloading for the proxy's requests.

    :param settings: `offload`, `offload_read_rounds` and the mode.
    :param store: The state store offloaded texts are kept in.
    :param base: The proxy's chain, which offloading joins.
    :param metrics: The service's metrics now (they move to the app's registry once it exists).
    """

    def __init__(
        self, settings: Settings, store: StateStore, base: CompactionChain, metrics: Callable[[], CompactionMetrics]
    ) -> None:
        self.enabled = settings.offload and settings.mode is Mode.ENFORCE
        self.rounds = settings.offload_read_rounds
        self.store = store
        self.base = base
        self.metrics = metrics

    def for_request(self, off: bool) -> tuple[StagingOffloadStore | None, CompactionChain]:
        """Where a request's compaction offloads to, and its chain: offloading to it before the first lossy strategy.

        :param off: No offloading for this request: it turned it off (`offload_off`), or it is not being compacted.
            The setting and the mode can turn it off too. Then there is no staging store and the chain is the proxy's.
        """
        if not self.enabled or off:
            return None, self.base
        staging = StagingOffloadStore()
        strategies = list(self.base.strategies)
        at = next((i for i, strategy in enumerate(strategies) if strategy.name in LOSSY), len(strategies))
        strategies.insert(at, ToolResultOffload(staging, pointer=POINTER))
        return staging, CompactionChain(strategies)

    async def persist(self, tenant: bytes, staging: StagingOffloadStore | None) -> None:
        """Keep what the compaction offloaded, under the tenant, before the request that refers to it is forwarded."""
        pending = staging.pending() if staging is not None else {}
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
        request: ChatRequest | ResponsesRequest,
        tenant: bytes,
        meta: Sequence[Mapping[str, Any]] | None,
        headers: dict[str, str],
    ) -> tuple[ChatRequest | ResponsesRequest, ReadBack | None]:
        """The request to forward with messages of this metadata, and the reads to answer for it.

        When the messages hold offloaded results, the request gets the read tool and `headers` say so; the texts they
        refer to live on as long as the conversation: each request holding them refreshes them. Otherwise the request
        is returned as it is, with no reads.
        """
        references = held_references(meta)
        if not references:
            return request, None
        await self.store.touch_offloaded(tenant, references)
        headers.update({OFFLOADED_HEADER: str(len(references)), READS_HEADER: "0"})
        api = Api.RESPONSES if isinstance(request, ResponsesRequest) else Api.CHAT
        return with_read_tool(request), ReadBack(tenant, self.store, api, self.rounds, self.metrics())
