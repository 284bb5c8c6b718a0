"""Compaction strategies, each usable alone or in an ordered `CompactionChain`."""

from proxy.engine.strategies.base import Strategy
from proxy.engine.strategies.chain import CompactionChain, CompactionResult
from proxy.engine.strategies.duplicate_results import DuplicateResults
from proxy.engine.strategies.json_minify import JsonMinify
from proxy.engine.strategies.middle_out import MiddleOut
from proxy.engine.strategies.offload import MemoryOffloadStore, OffloadStore, ToolResultOffload
from proxy.engine.strategies.repeated_lines import RepeatedLines
from proxy.engine.strategies.sliding_window import SlidingWindow
from proxy.engine.strategies.summarization import Summarization, Summarizer, SummaryRequest
from proxy.engine.strategies.superseded_results import SupersededResults
from proxy.engine.strategies.tool_result_pruning import ToolResultPruning
from proxy.engine.strategies.user_message_window import UserMessageWindow

__all__ = [
    "CompactionChain",
    "CompactionResult",
    "DuplicateResults",
    "JsonMinify",
    "MemoryOffloadStore",
    "MiddleOut",
    "OffloadStore",
    "RepeatedLines",
    "SlidingWindow",
    "Strategy",
    "Summarization",
    "Summarizer",
    "SummaryRequest",
    "SupersededResults",
    "ToolResultOffload",
    "ToolResultPruning",
    "UserMessageWindow",
]
