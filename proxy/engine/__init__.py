"""The compaction engine: provider-neutral, free of HTTP and of Haystack.

Messages are OpenAI Chat Completions dicts. A `Transcript` wraps a conversation with its per-message token counts;
`decide` says whether it needs compacting and to what budget; a `CompactionChain` of strategies returns an
`EditPlan` that each front end applies to its own message objects.
"""

from proxy.engine.calibration import Calibration
from proxy.engine.compaction import Outcome, Room, calibrated_decision, compact_if_needed, decision_room, leading_room
from proxy.engine.counting import ApproximateCounter, TiktokenCounter, TokenCounter, counter_for_model
from proxy.engine.plan import COMPACTION_META_KEY, Created, EditPlan, Kept
from proxy.engine.strategies import (
    CompactionChain,
    CompactionResult,
    DuplicateResults,
    JsonMinify,
    MemoryOffloadStore,
    MiddleOut,
    OffloadStore,
    RepeatedLines,
    SlidingWindow,
    Strategy,
    Summarization,
    Summarizer,
    SummaryRequest,
    SupersededResults,
    ToolResultOffload,
    ToolResultPruning,
    UserMessageWindow,
)
from proxy.engine.strategies.registry import DEFAULT_CHAIN, STRATEGY_NAMES, chain_by_names
from proxy.engine.transcript import Transcript
from proxy.engine.trigger import Anchor, Decision, Thresholds, decide, estimate_tokens

__all__ = [
    "COMPACTION_META_KEY",
    "DEFAULT_CHAIN",
    "STRATEGY_NAMES",
    "Anchor",
    "ApproximateCounter",
    "Calibration",
    "CompactionChain",
    "CompactionResult",
    "Created",
    "Decision",
    "DuplicateResults",
    "EditPlan",
    "JsonMinify",
    "Kept",
    "MemoryOffloadStore",
    "MiddleOut",
    "OffloadStore",
    "Outcome",
    "RepeatedLines",
    "Room",
    "SlidingWindow",
    "Strategy",
    "Summarization",
    "Summarizer",
    "SummaryRequest",
    "SupersededResults",
    "Thresholds",
    "TiktokenCounter",
    "TokenCounter",
    "ToolResultOffload",
    "ToolResultPruning",
    "Transcript",
    "UserMessageWindow",
    "calibrated_decision",
    "chain_by_names",
    "compact_if_needed",
    "counter_for_model",
    "decide",
    "decision_room",
    "estimate_tokens",
    "leading_room",
]
