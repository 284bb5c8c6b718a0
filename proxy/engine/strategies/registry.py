"""Strategies by name, for configuration files, CLI flags and request headers."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.engine.strategies.base import Strategy
from proxy.engine.strategies.chain import CompactionChain
from proxy.engine.strategies.middle_out import MiddleOut
from proxy.engine.strategies.provider_compaction import ProviderCompaction
from proxy.engine.strategies.sliding_window import SlidingWindow
from proxy.engine.strategies.summarization import Summarization, Summarizer
from proxy.engine.strategies.tool_result_pruning import ToolResultPruning

STRATEGY_NAMES = (
    ProviderCompaction.name,
    ToolResultPruning.name,
    SlidingWindow.name,
    Summarization.name,
    MiddleOut.name,
)
DEFAULT_CHAIN = (ProviderCompaction.name, ToolResultPruning.name, SlidingWindow.name, MiddleOut.name)


def strategy_by_name(name: str, summarizer: Summarizer | None = None) -> Strategy:
    """A strategy with its default settings.

    :raises ValueError: If the name is unknown, or `summarization` is asked for without a summarizer.
    """
    if name == ProviderCompaction.name:
        return ProviderCompaction()
    if name == ToolResultPruning.name:
        return ToolResultPruning()
    if name == SlidingWindow.name:
        return SlidingWindow()
    if name == MiddleOut.name:
        return MiddleOut()
    if name == Summarization.name:
        if summarizer is None:
            raise ValueError("The `summarization` strategy needs a summarizer (an LLM to write summaries).")
        return Summarization(summarizer)
    raise ValueError(f"Unknown compaction strategy {name!r}; choose from {', '.join(STRATEGY_NAMES)}.")


def chain_by_names(names: Sequence[str], summarizer: Summarizer | None = None) -> CompactionChain:
    """A chain of the named strategies, in order.

    :raises ValueError: If a name is unknown or the list is empty.
    """
    return CompactionChain([strategy_by_name(name, summarizer) for name in names])
