"""A compactor that keeps what the user said: the engine's `UserMessageWindow` for Haystack's `CompactionHook`.

Haystack's own compactors keep their semantics (`SlidingWindowCompactor` drops whole old turns, the user's messages
with them); this one is the proxy's default behaviour, offered as an extra compactor.
"""

from __future__ import annotations

from typing import Any

from haystack.core.serialization import default_to_dict

from hooks.compaction.compactors import EngineCompactor
from proxy.engine import Strategy, UserMessageWindow
from proxy.engine.strategies.user_message_window import DEFAULT_OMISSION_NOTE, DEFAULT_USER_TEXT_SHARE


class UserMessageWindowCompactor(EngineCompactor):
    """Keeps the user's own messages and drops the oldest assistant messages and tool results until the rest fits.

    The leading system messages and the latest user message are always kept. The user's earlier messages are kept
    byte for byte within `user_text_share` of the target; past it the longest (a pasted log) are cut middle-out, then
    the ones in the middle are removed before the opening ones (where a task's requirements are stated) and the
    latest. Assistant prose, reasoning and tool calls with all their results go first, oldest turn first, a turn's
    share at a time; the current task's newest `min_keep_steps` steps always stay. One omission note, where the first
    removed message was, says that assistant and tool messages went and how many user messages; a later compaction
    folds it into its own in the same place, so the messages before it stay a cached prefix.

    ```python
    from hooks.compaction import CompactionHook, UserMessageWindowCompactor

    hook = CompactionHook(compactor=UserMessageWindowCompactor(), context_window=128_000)
    ```
    """

    def __init__(
        self,
        *,
        user_text_share: float = DEFAULT_USER_TEXT_SHARE,
        min_keep_steps: int = 1,
        min_user_message_tokens: int = 512,
        opening_user_messages: int = 2,
        latest_user_messages: int = 2,
        omission_note: str = DEFAULT_OMISSION_NOTE,
    ) -> None:
        """Initialize the compactor.

        :param user_text_share: The share of the target the user's earlier messages may take, between 0 and 1.
        :param min_keep_steps: The fewest complete recent Agent steps of the current task kept even over the target.
        :param min_user_message_tokens: The size below which no user message is cut: past it, messages are removed.
        :param opening_user_messages: How many of the user's first messages are the last to be removed.
        :param latest_user_messages: How many of the user's latest earlier messages are removed just before those.
        :param omission_note: The user message left in place of what was removed: `{num_removed_user}` is replaced by
            the number of user messages removed, and `{num_removed}`, where a note names it, by the number of
            assistant and tool messages (the default does not: a count that changes every compaction would change the
            cached prefix).
        :raises ValueError: If `user_text_share` is outside [0, 1] or a count is negative.
        """
        self.user_text_share = user_text_share
        self.min_keep_steps = min_keep_steps
        self.min_user_message_tokens = min_user_message_tokens
        self.opening_user_messages = opening_user_messages
        self.latest_user_messages = latest_user_messages
        self.omission_note = omission_note
        self.strategies()

    def _settings(self) -> dict[str, Any]:
        return {
            "user_text_share": self.user_text_share,
            "min_keep_steps": self.min_keep_steps,
            "min_user_message_tokens": self.min_user_message_tokens,
            "opening_user_messages": self.opening_user_messages,
            "latest_user_messages": self.latest_user_messages,
            "omission_note": self.omission_note,
        }

    def strategies(self) -> list[Strategy]:
        """The engine's `UserMessageWindow` with these settings."""
        return [UserMessageWindow(**self._settings())]

    def to_dict(self) -> dict[str, Any]:
        """Serialize the compactor.

        :returns: A dictionary representation of the compactor.
        """
        return default_to_dict(self, **self._settings())
