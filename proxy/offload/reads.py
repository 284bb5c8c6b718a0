"""Answering the model's reads: the offloaded text, found under the caller's tenant only.

A reference is a content hash: it names a text but grants nothing. The store is asked under the tenant of the
request the model is answering, so a reference from another tenant's conversation (or a guess) finds nothing, and the
model is told so in the tool's result, the same way as for an expired one.

A result the store no longer holds (evicted, expired, lost with a Redis) is not lost while its conversation goes on:
the client re-sends the original in full every turn, and the rewrite replayed on it still points at it. A read of a
reference the forwarded request holds that the store misses is answered from the request's own tool results (the
one whose text, as sent or JSON-minified as it was offloaded, has that reference) and stored again, so the rest of
the conversation reads it from the store. Only the request's own references are looked for, in its own messages:
nothing of another tenant's can be found this way, and a guessed reference costs no search.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Final

from proxy.chat.exchange import Api
from proxy.chat.metrics import CompactionMetrics
from proxy.engine.messages import Message, content_text, is_tool_result
from proxy.engine.strategies.json_minify import minified
from proxy.engine.strategies.offload import content_reference
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
    :param held: The references of the offloaded results the forwarded request holds.
    :param originals: The request's messages as the client sent them, where a result the store misses is found.
    """

    tenant: bytes
    store: StateStore
    api: Api
    rounds: int
    metrics: CompactionMetrics
    held: frozenset[str] = frozenset()
    originals: Callable[[], Awaitable[Sequence[Message]]] | None = None

    async def results(self, reads: Reads) -> list[str]:
        """The text answering each read call, in order."""
        found: dict[str, str | None] = {}
        for _call_id, reference in reads.calls:
            if reference and reference not in found:
                found[reference] = await self._text(reference)
        missed = {reference for reference, text in found.items() if text is None and reference in self.held}
        if missed:
            found.update(await self._restore(missed))
        texts: list[str] = []
        for _call_id, reference in reads.calls:
            text = found.get(reference) if reference else None
            self.metrics.offload_reads.labels("served" if text is not None else "not_held").inc()
            texts.append(NOT_HELD if text is None else text)
        return texts

    async def _restore(self, references: set[str]) -> dict[str, str]:
        """The texts of these held references found in the re-sent originals, stored again under the tenant.

        When storing them fails (logged, counted), they still answer this request's reads.
        """
        if self.originals is None:
            return {}
        restored = await asyncio.to_thread(resent_originals, await self.originals(), references)
        if not restored:
            return restored
        try:
            await self.store.save_offloaded(self.tenant, restored)
        except Exception as error:
            log_failure(logger, "Storing re-sent offloaded results again failed; they answer this request only.", error)
            self.metrics.errors.inc()
        else:
            self.metrics.offload_restored.inc(len(restored))
        return restored

    async def _text(self, reference: str) -> str | None:
        """The text under `reference`; None also when the store fails (logged, counted): the model is told so."""
        try:
            return await self.store.offloaded(self.tenant, reference)
        except Exception as error:
            log_failure(logger, "Reading an offloaded result failed; the model is told it is not held.", error)
            self.metrics.errors.inc()
            return None


def resent_originals(messages: Sequence[Message], references: Collection[str]) -> dict[str, str]:
    """The texts, among the tool results of `messages`, that were offloaded under these references.

    A result is offloaded as sent, or JSON-minified when `json_minify` rewrote it first: both are tried. One pass,
    hashing each tool result at most twice; it stops once every reference is found.
    """
    found: dict[str, str] = {}
    for message in messages:
        if len(found) == len(references):
            break
        if not is_tool_result(message):
            continue
        text = content_text(message)
        for candidate in (text, minified(text)):
            if candidate and (reference := content_reference(candidate)) in references:
                found[reference] = candidate
                break
    return found
