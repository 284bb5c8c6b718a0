"""A tool-using agent with extended thinking on the official `anthropic` SDK, as Claude Code drives the Messages API.

Each turn it sends its whole history, with its own cache breakpoints on the system prompt and on the newest message
(moved there every turn); a new task starts whenever the model answered in text, and each tool call gets a large
result, so the conversation outgrows a small window within a few dozen tasks. It streams the turns `streamed` says
to, and records what each answer reported.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from anthropic import AsyncAnthropic

SYSTEM: list[Any] = [
    {"type": "text", "text": "You are a careful coding agent. " * 40, "cache_control": {"type": "ephemeral"}}
]
TOOLS: list[Any] = [
    {
        "name": "search",
        "description": "Search the code base.",
        "input_schema": {"type": "object", "properties": {"q": {"type": "integer"}}},
    }
]
THINKING: Any = {"type": "enabled", "budget_tokens": 1024}
RESULT_WORDS = 400
"""Words of each tool result: about 400 tokens, so a task of two calls adds about 1,100 tokens."""


def task_text(turn: int) -> str:
    """The user's words opening task `turn`: about 80 tokens."""
    return f"Task {turn}: " + "details " * 80


def with_breakpoint_last(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with the client's breakpoint on the newest one's last block only."""
    *head, last = messages
    content = last["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    blocks[-1] = {**blocks[-1], "cache_control": {"type": "ephemeral"}}
    return [*head, {**last, "content": blocks}]


@dataclass
class AgentRun:
    """What the run's answers reported.

    :param prompt: Prompt tokens over all turns (`input_tokens` + cache writes + cache reads).
    :param cached: Of them, read from the cache.
    :param decisions: Each turn's `X-Compaction` response header.
    :param messages: The client's whole history at the end.
    """

    prompt: int = 0
    cached: int = 0
    decisions: list[str] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def cached_share(self) -> float:
        """The share of prompt tokens read from the cache."""
        return self.cached / self.prompt if self.prompt else 0.0

    def body(self, model: str) -> dict[str, Any]:
        """The request the client sends next (without a new task)."""
        return {
            "model": model,
            "max_tokens": 1024,
            "system": SYSTEM,
            "tools": TOOLS,
            "thinking": THINKING,
            "messages": with_breakpoint_last(self.messages),
        }


async def run_agent(
    client: AsyncAnthropic,
    model: str,
    turns: int,
    streamed: Callable[[int], bool],
    before: Callable[[int, dict[str, Any]], Awaitable[None]] | None = None,
    *,
    task: Callable[[int], str | list[Any]] = task_text,
    **extra: Any,
) -> AgentRun:
    """Run `turns` requests of the agent; `extra` goes to each request (`extra_headers`, ...).

    :param before: Called with each turn's index and request body before it is sent (a client counting its tokens).
    :param task: The content of the user message opening a task, by the turn it opens on.
    """
    run = AgentRun()
    for turn in range(turns):
        last = run.messages[-1] if run.messages else None
        if last is None or (last["role"] == "assistant" and last["content"][-1]["type"] == "text"):
            run.messages.append({"role": "user", "content": task(turn)})
        body = run.body(model)
        if before is not None:
            await before(turn, body)
        if streamed(turn):
            async with client.messages.stream(**body, **extra) as stream:
                message = await stream.get_final_message()
                headers = stream.response.headers
        else:
            raw = await client.messages.with_raw_response.create(**body, **extra)
            message, headers = await raw.parse(), raw.headers
        usage = message.usage
        prompt = usage.input_tokens + (usage.cache_creation_input_tokens or 0) + (usage.cache_read_input_tokens or 0)
        run.prompt += prompt
        run.cached += usage.cache_read_input_tokens or 0
        run.decisions.append(headers.get("x-compaction", ""))
        content = [block.model_dump(exclude_none=True) for block in message.content]
        run.messages.append({"role": "assistant", "content": content})
        calls = [block for block in content if block["type"] == "tool_use"]
        if calls:
            results = [
                {"type": "tool_result", "tool_use_id": call["id"], "content": "found " * RESULT_WORDS} for call in calls
            ]
            run.messages.append({"role": "user", "content": results})
    return run
