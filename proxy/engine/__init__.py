"""The compaction engine: provider-neutral, free of HTTP and of Haystack.

Messages are OpenAI Chat Completions dicts. A `Transcript` wraps a conversation with its per-message token counts;
`decide` says whether it needs compacting and to what budget; a `CompactionChain` of strategies returns an
`EditPlan` that each front end applies to its own message objects.
"""

from proxy.engine.counting import ApproximateCounter, TiktokenCounter, TokenCounter, counter_for_model
from proxy.engine.plan import COMPACTION_META_KEY, Created, EditPlan, Kept
from proxy.engine.strategies import (
    CompactionChain,
    CompactionResult,
    MiddleOut,
    SlidingWindow,
    Strategy,
    Summarization,
    Summarizer,
    SummaryRequest,
    ToolResultPruning,
)
from proxy.engine.transcript import Transcript
from proxy.engine.trigger import Anchor, Decision, Thresholds, decide, estimate_tokens

__all__ = [
    "COMPACTION_META_KEY",
    "Anchor",
    "ApproximateCounter",
    "CompactionChain",
    "CompactionResult",
    "Created",
    "Decision",
    "EditPlan",
    "Kept",
    "MiddleOut",
    "SlidingWindow",
    "Strategy",
    "Summarization",
    "Summarizer",
    "SummaryRequest",
    "Thresholds",
    "TiktokenCounter",
    "TokenCounter",
    "ToolResultPruning",
    "Transcript",
    "counter_for_model",
    "decide",
    "estimate_tokens",
]
