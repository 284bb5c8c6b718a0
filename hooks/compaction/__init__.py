"""Haystack's context-compaction hook over the compaction engine: swap one import.

`from hooks.compaction import CompactionHook, SlidingWindowCompactor, ...` works wherever
`from haystack.hooks.compaction import ...` does, with the same parameters, defaults and serialization, and decides
with the same engine as the compaction proxy.

Importing this package adds it (and only it) to Haystack's deserialization allowlist, so an `Agent` carrying the
hook round-trips through `to_dict`/`from_dict` as one carrying Haystack's own hook does.
"""

from haystack.core.serialization_security import allow_deserialization_module
from haystack.hooks.compaction.types import Compactor

from hooks.compaction.compactors import (
    ChainCompactor,
    EngineCompactor,
    LosslessCompactor,
    MiddleOutCompactor,
    SlidingWindowCompactor,
    ToolResultPruningCompactor,
)
from hooks.compaction.counters import ApproximateTokenCounter, HaystackCounterAdapter, TiktokenTokenCounter
from hooks.compaction.hook import CompactionHook
from hooks.compaction.offload import ToolResultOffloadCompactor
from hooks.compaction.summarizer import ChatGeneratorSummarizer, SummarizationCompactor
from hooks.compaction.user_messages import UserMessageWindowCompactor

allow_deserialization_module("hooks.compaction")

__all__ = [
    "ApproximateTokenCounter",
    "ChainCompactor",
    "ChatGeneratorSummarizer",
    "CompactionHook",
    "Compactor",
    "EngineCompactor",
    "HaystackCounterAdapter",
    "LosslessCompactor",
    "MiddleOutCompactor",
    "SlidingWindowCompactor",
    "SummarizationCompactor",
    "TiktokenTokenCounter",
    "ToolResultOffloadCompactor",
    "ToolResultPruningCompactor",
    "UserMessageWindowCompactor",
]
