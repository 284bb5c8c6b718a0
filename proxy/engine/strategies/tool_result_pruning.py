"""Tool-result pruning: older large tool results give way to a short placeholder; the conversation keeps its shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.engine.digest import digest
from proxy.engine.grouping import agent_step_groups
from proxy.engine.plan import Created, EditPlan
from proxy.engine.strategies.base import Strategy, replace_until_target
from proxy.engine.tool_results import answered_calls, holds_result, result_tool_name
from proxy.engine.transcript import Transcript, created

DEFAULT_PLACEHOLDER = "[This tool result was removed to free up context. Call `{tool_name}` again if you need it.]"


class ToolResultPruning(Strategy):
    """Replaces the content of older tool results, oldest first, until the conversation reaches the target.

    Tool output dominates a long agent run and mostly stops mattering once the model has acted on it. Rewriting the
    result in place keeps every call paired with a result, so the model still sees what it ran and can run it again.

    :param min_keep_steps: How many of the newest tool-calling steps keep their results untouched. At least 1: the
        latest results are what the model is about to act on.
    :param min_tokens: Only results larger than this many tokens are pruned; small ones cost little to keep.
    :param placeholder: The text left in place of a result; `{tool_name}` is replaced by the tool's name.
    :param skip_meta_keys: Results whose metadata holds any of these keys are left alone (for example results a
        Haystack `ToolResultOffloadHook` already replaced with a reference the model needs to read them back).
    :param with_digest: The placeholder is followed by a digest of the result (`proxy.engine.digest`: the call, the
        size, the telling lines), so the model knows what it lost and whether to run the tool again. Off by default,
        as Haystack's placeholder is; the proxy's chain turns it on.
    :raises ValueError: If `min_keep_steps` is below 1 or `min_tokens` is negative.
    """

    name = "tool_result_pruning"

    def __init__(
        self,
        *,
        min_keep_steps: int = 1,
        min_tokens: int = 200,
        placeholder: str = DEFAULT_PLACEHOLDER,
        skip_meta_keys: tuple[str, ...] = ("tool_result_offloaded",),
        with_digest: bool = False,
    ) -> None:
        check_result_rules(min_keep_steps, min_tokens)
        self.min_keep_steps = min_keep_steps
        self.min_tokens = min_tokens
        self.placeholder = placeholder
        self.skip_meta_keys = tuple(skip_meta_keys)
        self.with_digest = with_digest

    def _propose(self, transcript: Transcript, target_tokens: int) -> EditPlan | None:
        protected = newest_results(transcript, self.min_keep_steps)
        # Oldest first, so as much recent output as possible stays.
        candidates = (
            index for index in range(len(transcript)) if index not in protected and self._prunable(transcript, index)
        )
        calls = answered_calls(transcript)
        return replace_until_target(
            transcript, target_tokens, candidates, lambda index, _excess: self._pruned(transcript, index, calls)
        )

    def _prunable(self, transcript: Transcript, index: int) -> bool:
        return (
            holds_result(transcript, index)
            and not any(key in transcript.meta[index] for key in self.skip_meta_keys)
            and transcript.tokens(index) > self.min_tokens
        )

    def _pruned(self, transcript: Transcript, index: int, calls: Mapping[int, Mapping[str, Any]]) -> Created:
        message = transcript.messages[index]
        call = calls.get(index)
        text = self.placeholder.replace("{tool_name}", result_tool_name(message, call))
        if self.with_digest:
            text += "\n" + digest(message, call)
        return created(
            {**message, "content": text},
            self.name,
            replacing=index,
            base_meta=transcript.meta[index],
            original_tokens=transcript.tokens(index),
        )


def check_result_rules(min_keep_steps: int, min_tokens: int) -> None:
    """Check the settings every rewriter of older tool results shares.

    :raises ValueError: If `min_keep_steps` is below 1 or `min_tokens` is negative.
    """
    if min_keep_steps < 1:
        raise ValueError(
            f"`min_keep_steps` must be at least 1, got {min_keep_steps}. The most recent tool-calling step "
            f"contains results the model may still need."
        )
    if min_tokens < 0:
        raise ValueError(f"`min_tokens` must be at least 0, got {min_tokens}.")


def newest_results(transcript: Transcript, min_keep_steps: int) -> set[int]:
    """The indices of the tool results of the newest `min_keep_steps` tool-calling steps, which stay untouched."""
    result_steps = [group[1:] for group in agent_step_groups(transcript, 0) if len(group) > 1]
    return {index for step in result_steps[-min_keep_steps:] for index in step}
