"""Fixtures for the Haystack hook: the loopback OpenAI-like upstream, generators pointed at it, and tools."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from haystack import component
from haystack.components.agents import Agent
from haystack.components.agents.state.state import State
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.core.serialization import default_from_dict, default_to_dict
from haystack.dataclasses import ChatMessage
from haystack.dataclasses import ToolCall as HaystackToolCall
from haystack.hooks.protocol import Hook
from haystack.tools import Tool
from haystack.utils import Secret

from proxy.simulator.openai_upstream import OpenAIUpstream, Reply, Responder, ToolCall, tool_call_id

MODEL = "gpt-4o-mini"
API_KEY_VAR = "COMPACTION_HOOK_TEST_OPENAI_KEY"


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key from the environment, so generators (and Agents carrying them) serialize."""
    monkeypatch.setenv(API_KEY_VAR, "sk-test")


@contextmanager
def running_upstream(responder: Responder, **options: Any) -> Iterator[OpenAIUpstream]:
    """The fake upstream serving on its own event loop in a thread, so sync and async generators can both call it."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    upstream = OpenAIUpstream(responder, **options)
    asyncio.run_coroutine_threadsafe(upstream.start(), loop).result()
    try:
        yield upstream
    finally:
        asyncio.run_coroutine_threadsafe(upstream.close(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def generator_for(upstream: OpenAIUpstream) -> OpenAIChatGenerator:
    """Haystack's real OpenAIChatGenerator, pointed at the fake upstream, failing fast."""
    return OpenAIChatGenerator(
        api_key=Secret.from_env_var(API_KEY_VAR),
        model=MODEL,
        api_base_url=upstream.base_url + "/v1",
        max_retries=0,
        timeout=30,
    )


def search_result(step: int, call: int) -> str:
    """A bulky, deterministic tool result (about 550 o200k tokens)."""
    return f"results for step {step} call {call}: " + " ".join(
        f"document-{step}-{n} mentions alpha" for n in range(110)
    )


SEARCH = Tool(
    name="search",
    description="Search the corpus for the given step.",
    parameters={
        "type": "object",
        "properties": {"step": {"type": "integer"}, "call": {"type": "integer"}},
        "required": ["step", "call"],
    },
    function=search_result,
)


def agent_for(upstream: OpenAIUpstream, hook: Hook, *, max_agent_steps: int = 200) -> Agent:
    """An Agent with the `search` tool, the hook under `before_llm`, and a system prompt."""
    return Agent(
        chat_generator=generator_for(upstream),
        tools=[SEARCH],
        system_prompt="You are a careful research agent. Use the search tool step by step.",
        hooks={"before_llm": [hook]},
        max_agent_steps=max_agent_steps,
    )


def stepping_responder(steps: int, tool_name: str = "search") -> Responder:
    """A model working through `steps` numbered tool calls, then answering; robust to compaction.

    The next step is read from the arguments of the latest call still in the conversation, so a conversation whose
    older steps were removed, pruned or summarized carries on where it was (`tool_loop_responder` counts the calls
    it can see, which compaction lowers).
    """

    def respond(request: dict[str, Any]) -> Reply:
        messages: list[dict[str, Any]] = request["messages"]
        last_step = 0
        for message in reversed(messages):
            calls = message.get("tool_calls") if message.get("role") == "assistant" else None
            if calls:
                last_step = int(json.loads(calls[-1]["function"]["arguments"])["step"])
                break
        if last_step >= steps or messages[-1].get("role") not in ("user", "tool"):
            return Reply(content=f"done: {last_step} tool calls")
        step = last_step + 1
        arguments = json.dumps({"step": step, "call": 0})
        return Reply(tool_calls=(ToolCall(id=tool_call_id("step", step), name=tool_name, arguments=arguments),))

    return respond


@pytest.fixture
def long_task_upstream() -> Iterator[OpenAIUpstream]:
    """An upstream with an 8k window driving a 60-step tool loop."""
    with running_upstream(stepping_responder(60), context_window=8192) as upstream:
        yield upstream


def state_with(messages: list[ChatMessage], context_tokens: int = 0, tools: list[Tool] | None = None) -> State:
    """An Agent-like `State` holding a conversation, the provider's last count and the tools."""
    schema = {"context_tokens": {"type": int}, "tools": {"type": list[Tool]}}
    return State(schema=schema, data={"messages": messages, "context_tokens": context_tokens, "tools": tools or []})


def long_conversation(steps: int, *, task: str = "Research alpha thoroughly.") -> list[ChatMessage]:
    """A system prompt, a task and `steps` Agent steps with bulky search results, as an Agent builds it."""
    messages = [ChatMessage.from_system("You are a careful research agent."), ChatMessage.from_user(task)]
    for step in range(1, steps + 1):
        call = HaystackToolCall(id=f"call_{step}", tool_name="search", arguments={"step": step, "call": 0})
        messages.append(ChatMessage.from_assistant(tool_calls=[call], meta={"step": step}))
        messages.append(ChatMessage.from_tool(search_result(step, 0), origin=call, meta={"step": step}))
    return messages


@component
class FakeSummaryGenerator:
    """A chat generator that writes a fixed short summary and records its calls and lifecycle (sync and async)."""

    def __init__(self, text: str = "- searched alpha, steps summarized") -> None:
        self.text = text
        self.calls: list[str] = []
        self.prompts: list[list[ChatMessage]] = []

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage]) -> dict[str, Any]:
        self.calls.append("run")
        self.prompts.append(messages)
        return {"replies": [ChatMessage.from_assistant(self.text)]}

    @component.output_types(replies=list[ChatMessage])
    async def run_async(self, messages: list[ChatMessage]) -> dict[str, Any]:
        self.calls.append("run_async")
        self.prompts.append(messages)
        return {"replies": [ChatMessage.from_assistant(self.text)]}

    def warm_up(self) -> None:
        self.calls.append("warm_up")

    def close(self) -> None:
        self.calls.append("close")

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, text=self.text)


class RecordingCounter:
    """A Haystack `TokenCounter` (4 characters a token over each message's text) recording its lifecycle calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def count(self, messages: list[ChatMessage], tools: Any = None) -> int:
        text = "".join(
            (m.text or "") + "".join(str(r.result) for r in m.tool_call_results) + str(m.tool_calls) for m in messages
        )
        return len(text) // 4 + 4 * len(messages)

    def warm_up(self) -> None:
        self.calls.append("warm_up")

    def close(self) -> None:
        self.calls.append("close")

    async def close_async(self) -> None:
        self.calls.append("close_async")

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RecordingCounter:
        return default_from_dict(cls, data)
