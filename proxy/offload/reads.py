"""Answering the model's reads: the offloaded text, found under the caller's tenant only.

A reference is a content hash: it names a text but grants nothing. The store is asked under the tenant of the
request the model is answering, so a reference from another tenant's conversation (or a guess) finds nothing, and the
model is told so in the tool's result, the same way as for an expired one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from proxy.chat.exchange import Api
from proxy.chat.metrics import CompactionMetrics
from proxy.failures import log_failure
from proxy.offload.rounds import Reads
from proxy.state import StateStore

logger = logging.getLogger("proxy.compaction")

NOT_HELD: Final = (
    "No offloaded result is held under this reference (it may have expired). Continue without it, or run the original "
    "tool again if you need its output."
)
"""The read tool's result when the reference names nothing this caller offloaded."""


@dataclass(frozen=True)
class ReadBack:
    """What the server needs to answer the read tool for one request.

    :param tenant: The caller's tenant: the only scope reads look in.
    :param store: Where offloaded results live.
    :param api: The request's wire format.
    :param rounds: Most read rounds answered (`offload_read_rounds`).
    :param metrics: Where reads are counted.
    """

    tenant: bytes
    store: StateStore
    api: Api
    rounds: int
    metrics: CompactionMetrics

    async def results(self, reads: Reads) -> list[str]:
        """The text answering each read call, in order."""
        texts: list[str] = []
        for _call_id, reference in reads.calls:
            text = await self._text(reference) if reference else None
            self.metrics.offload_reads.labels("served" if text is not None else "not_held").inc()
            texts.append(NOT_HELD if text is None else text)
        return texts

    async def _text(self, reference: str) -> str | None:
        """The text under `reference`; None also when the store fails (logged, counted): the model is told so."""
        try:
            return await self.store.offloaded(self.tenant, reference)
        except Exception as error:
            log_failure(logger, "Reading an offloaded result failed; the model is told it is not held.", error)
            self.metrics.errors.inc()
            return None
