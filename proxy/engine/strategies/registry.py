"""Strategies by name, for configuration files, CLI flags and request headers."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.engine.strategies.base import Strategy
from proxy.engine.strategies.chain import CompactionChain
from proxy.engine.strategies.duplicate_results import DuplicateResults
from proxy.engine.strategies.json_minify import JsonMinify
from proxy.engine.strategies.middle_out import MiddleOut
from proxy.engine.strategies.provider_compaction import ProviderCompaction
from proxy.engine.strategies.repeated_lines import RepeatedLines
from proxy.engine.strategies.sliding_window import SlidingWindow
from proxy.engine.strategies.summarization import Summarization, Summarizer
from proxy.engine.strategies.superseded_results import SupersededResults
from proxy.engine.strategies.tool_result_pruning import ToolResultPruning
from proxy.engine.strategies.user_message_window import DEFAULT_USER_TEXT_SHARE, UserMessageWindow

STRATEGY_NAMES = (
    ProviderCompaction.name,
    DuplicateResults.name,
    SupersededResults.name,
    JsonMinify.name,
    RepeatedLines.name,
    ToolResultPruning.name,
    UserMessageWindow.name,
    SlidingWindow.name,
    Summarization.name,
    MiddleOut.name,
)
"""Every strategy, in the order a chain runs them."""
DEFAULT_CHAIN = tuple(name for name in STRATEGY_NAMES if name != Summarization.name)
"""Every strategy but summarization (it needs an LLM): lossless steps first, then loss. `superseded_results` does
nothing until tools are named for it. `user_message_window` reaches the target wherever `sliding_window` would while
keeping the user's messages, so the sliding window after it acts only where the user's words alone do not fit."""


def strategy_by_name(
    name: str,
    summarizer: Summarizer | None = None,
    *,
    superseded_tools: Sequence[str] = (),
    user_text_share: float = DEFAULT_USER_TEXT_SHARE,
) -> Strategy:
    """A strategy with its default settings.

    :param superseded_tools: The tools whose older results `superseded_results` replaces (see `SupersededResults`).
    :param user_text_share: The share of the target the user's earlier messages may take (see `UserMessageWindow`).
    :raises ValueError: If the name is unknown, or `summarization` is asked for without a summarizer.
    """
    if name == ProviderCompaction.name:
        return ProviderCompaction()
    if name == DuplicateResults.name:
        return DuplicateResults()
    if name == SupersededResults.name:
        return SupersededResults(superseded_tools)
    if name == JsonMinify.name:
        return JsonMinify()
    if name == RepeatedLines.name:
        return RepeatedLines()
    if name == ToolResultPruning.name:
        return ToolResultPruning(with_digest=True)
    if name == UserMessageWindow.name:
        return UserMessageWindow(user_text_share=user_text_share)
    if name == SlidingWindow.name:
        return SlidingWindow()
    if name == MiddleOut.name:
        return MiddleOut()
    if name == Summarization.name:
        if summarizer is None:
            raise ValueError("The `summarization` strategy needs a summarizer (an LLM to write summaries).")
        return Summarization(summarizer)
    raise ValueError(f"Unknown compaction strategy {name!r}; choose from {', '.join(STRATEGY_NAMES)}.")


def chain_by_names(
    names: Sequence[str],
    summarizer: Summarizer | None = None,
    *,
    superseded_tools: Sequence[str] = (),
    user_text_share: float = DEFAULT_USER_TEXT_SHARE,
) -> CompactionChain:
    """A chain of the named strategies, in order, with the settings `strategy_by_name` takes.

    :raises ValueError: If a name is unknown or the list is empty.
    """
    return CompactionChain(
        [
            strategy_by_name(name, summarizer, superseded_tools=superseded_tools, user_text_share=user_text_share)
            for name in names
        ]
    )
