"""Room for the read tool: a compaction that leaves offloaded results behind aims under the target by the tool's size.

The read tool comes with the first offloaded result a conversation holds, and its declaration is part of the request
from then on. A compaction made as if it were not would leave the request over its target by the tool's tokens, and
the next compaction would come back that much sooner. A conversation already sent with the tool has it counted with
its request's tools (`Offloading.counted`); this covers the compaction that brings it.
"""

from __future__ import annotations

from proxy.engine import CompactionChain
from proxy.engine.strategies.chain import CompactionResult
from proxy.engine.strategies.offload import held_references
from proxy.engine.transcript import Transcript


class ReadToolRoom(CompactionChain):
    """A chain made again under the target less `reserved_tokens` when its compaction leaves offloaded results.

    A compaction that leaves none is taken as it is: the request gets no tool, and nothing needs reserving.

    :param chain: The chain that offloads.
    :param reserved_tokens: What the read tool adds to the request (`proxy.pipeline.offload.tool.read_tool_tokens`).
    """

    def __init__(self, chain: CompactionChain, reserved_tokens: int) -> None:
        super().__init__(chain.strategies)
        self.chain = chain
        self.reserved_tokens = reserved_tokens

    def compact(self, transcript: Transcript, target_tokens: int) -> CompactionResult | None:
        """The chain's result, made again with room for the read tool when it brings the tool (see the class)."""
        first = self.chain.compact(transcript, target_tokens)
        if not self._short_of_room(first, target_tokens):
            return first
        return self.chain.compact(transcript, self._reserved(target_tokens)) or first

    async def compact_async(self, transcript: Transcript, target_tokens: int) -> CompactionResult | None:
        """Like `compact`, awaiting strategies that do I/O."""
        first = await self.chain.compact_async(transcript, target_tokens)
        if not self._short_of_room(first, target_tokens):
            return first
        return await self.chain.compact_async(transcript, self._reserved(target_tokens)) or first

    def _short_of_room(self, result: CompactionResult | None, target_tokens: int) -> bool:
        """Whether `result` leaves offloaded results over the target less the read tool."""
        if result is None or result.tokens_after <= self._reserved(target_tokens):
            return False
        return bool(held_references(result.compacted.meta))

    def _reserved(self, target_tokens: int) -> int:
        return max(target_tokens - self.reserved_tokens, 0)
