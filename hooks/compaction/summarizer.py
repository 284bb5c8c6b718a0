"""LLM summarization through any Haystack chat generator, planned by the engine's `Summarization` strategy.

The engine decides what to summarize, round by round, and how the summary replaces it; the chat generator only
writes the text. `ChatGeneratorSummarizer` is the engine's `Summarizer` over a Haystack chat generator, sync and async.
"""

from __future__ import annotations

from typing import Any, Self

from haystack.components.generators.chat.types import ChatGenerator
from haystack.core.serialization import component_to_dict, default_from_dict, default_to_dict
from haystack.dataclasses import ChatMessage
from haystack.utils.async_utils import _execute_component_async
from haystack.utils.deserialization import deserialize_component_inplace

from hooks.compaction.compactors import EngineCompactor
from proxy.engine import Strategy, Summarization, SummaryRequest
from proxy.engine.strategies.summarization import DEFAULT_SUMMARY_INSTRUCTION


class ChatGeneratorSummarizer:
    """The engine's `Summarizer` over a Haystack chat generator.

    Each request becomes two messages: the instruction as a system message, and the messages to summarize, rendered
    as plain text, as the user message. The summary is the text of the generator's last reply.

    :param chat_generator: The chat generator that writes summaries.
    """

    def __init__(self, chat_generator: ChatGenerator) -> None:
        self.chat_generator = chat_generator

    def summarize(self, request: SummaryRequest) -> str:
        """Ask the generator for the summary (blocking).

        :raises RuntimeError: If the generator returned no text.
        """
        return _reply_text(self.chat_generator.run(messages=_prompt(request)))

    async def summarize_async(self, request: SummaryRequest) -> str:
        """Ask the generator for the summary, with `run_async` when it has one (else `run` in a worker thread).

        :raises RuntimeError: If the generator returned no text.
        """
        result = await _execute_component_async(component_instance=self.chat_generator, messages=_prompt(request))
        return _reply_text(result)


def _prompt(request: SummaryRequest) -> list[ChatMessage]:
    return [
        ChatMessage.from_system(request.instruction),
        ChatMessage.from_user(f"<conversation_to_summarize>\n{request.rendered()}\n</conversation_to_summarize>"),
    ]


def _reply_text(result: dict[str, Any]) -> str:
    replies = result.get("replies") or []
    text = replies[-1].text if replies else None
    if not text or not text.strip():
        raise RuntimeError(f"The Chat Generator returned no usable text to use as a conversation summary: {result}.")
    return str(text)


class SummarizationCompactor(EngineCompactor):
    """Progressively summarizes the conversation with an LLM until it fits the target.

    History (before the latest user message) is summarized before the current task, raw messages before earlier
    summaries: each round summarizes the fewest oldest complete historical turns that make room; once history is only
    summaries, the oldest of those are combined; then the current task's oldest Agent steps (keeping the newest
    `min_keep_steps`); then the current task's summaries are combined. Each summary is a user message marked with
    `meta["context_compaction"]["strategy"] == "summarization"`, so Haystack's own compactors recognize it too.

    ```python
    from haystack.components.generators.chat import OpenAIChatGenerator
    from hooks.compaction import CompactionHook, SummarizationCompactor

    hook = CompactionHook(
        compactor=SummarizationCompactor(chat_generator=OpenAIChatGenerator(model="gpt-4.1-mini")),
        context_window=128_000,
    )
    ```
    """

    def __init__(
        self,
        chat_generator: ChatGenerator,
        *,
        min_keep_steps: int = 1,
        approximate_summary_tokens: int = 1024,
        summary_instruction: str = DEFAULT_SUMMARY_INSTRUCTION,
        raise_on_failure: bool = False,
    ) -> None:
        """Initialize the compactor.

        :param chat_generator: The Chat Generator that writes summaries; `run_async` is used in async runs when it
            has one. A cheaper model than the Agent's usually does.
        :param min_keep_steps: The fewest complete recent Agent steps of the current task never summarized, even
            when they exceed the target.
        :param approximate_summary_tokens: About how long a summary comes out. Used to plan how much to summarize per
            round, not a limit on the model: higher summarizes more per round (likelier to land under the target,
            giving up more), lower keeps more but may leave the result above the target.
        :param summary_instruction: The system instruction telling the model how to summarize a portion of the
            conversation. The default asks for fixed sections: objective, decisions and constraints, work done, exact
            identifiers, and what is unresolved.
        :param raise_on_failure: Raise when the generator fails or its summary does not shrink the conversation. By
            default the failure is logged and whatever was summarized successfully so far is kept.
        :raises ValueError: If `min_keep_steps` is negative or `approximate_summary_tokens` is not positive.
        """
        self.chat_generator = chat_generator
        self.min_keep_steps = min_keep_steps
        self.approximate_summary_tokens = approximate_summary_tokens
        self.summary_instruction = summary_instruction
        self.raise_on_failure = raise_on_failure
        self.strategies()

    def strategies(self) -> list[Strategy]:
        """The engine's `Summarization`, writing summaries with the chat generator."""
        return [
            Summarization(
                ChatGeneratorSummarizer(self.chat_generator),
                min_keep_steps=self.min_keep_steps,
                approximate_summary_tokens=self.approximate_summary_tokens,
                instruction=self.summary_instruction,
                raise_on_failure=self.raise_on_failure,
            )
        ]

    def warm_up(self) -> None:
        """Warm up the Chat Generator that writes summaries."""
        if hasattr(self.chat_generator, "warm_up"):
            self.chat_generator.warm_up()

    async def warm_up_async(self) -> None:
        """Warm up the Chat Generator on the serving event loop."""
        warm_up_async = getattr(self.chat_generator, "warm_up_async", None)
        if warm_up_async is not None:
            await warm_up_async()
        elif hasattr(self.chat_generator, "warm_up"):
            self.chat_generator.warm_up()

    def close(self) -> None:
        """Release the Chat Generator's resources."""
        if hasattr(self.chat_generator, "close"):
            self.chat_generator.close()

    async def close_async(self) -> None:
        """Release the Chat Generator's async resources."""
        close_async = getattr(self.chat_generator, "close_async", None)
        if close_async is not None:
            await close_async()
        elif hasattr(self.chat_generator, "close"):
            self.chat_generator.close()

    def to_dict(self) -> dict[str, Any]:
        """Serialize the compactor and its Chat Generator.

        :returns: A dictionary representation of the compactor.
        """
        return default_to_dict(
            self,
            chat_generator=component_to_dict(obj=self.chat_generator, name="chat_generator"),
            min_keep_steps=self.min_keep_steps,
            approximate_summary_tokens=self.approximate_summary_tokens,
            summary_instruction=self.summary_instruction,
            raise_on_failure=self.raise_on_failure,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Deserialize the compactor, reconstructing its Chat Generator.

        :param data: A dictionary representation produced by `to_dict`.
        :returns: The deserialized compactor.
        """
        init_params = data.get("init_parameters", {})
        if init_params.get("chat_generator") is not None:
            deserialize_component_inplace(data=init_params, key="chat_generator")
        return default_from_dict(cls, data)
