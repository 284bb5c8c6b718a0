"""End to end: an Agent whose older results were offloaded reads one back with Haystack's read tool and answers.

The Agent runs Haystack's real `OpenAIChatGenerator` against the fake OpenAI upstream on loopback, which enforces
a 4k window. The scripted model searches step by step; once it sees a reference to step 1's results in the
conversation, it calls the read tool with that reference, and answers with what only the full result holds.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Annotated, Any

import pytest
from haystack.components.agents import Agent
from haystack.dataclasses import ChatMessage
from haystack.hooks.tool_result_offloading import FileSystemToolResultStore
from haystack.tools import Tool, tool

from hooks.compaction import (
    ChainCompactor,
    CompactionHook,
    SlidingWindowCompactor,
    TiktokenTokenCounter,
    ToolResultOffloadCompactor,
    ToolResultPruningCompactor,
)
from proxy.simulator.openai_upstream import Reply, ToolCall, tool_call_id
from tests.hooks.conftest import generator_for, running_upstream, search_result
from tests.hooks.test_long_run import assert_pairs_intact

NEEDLE = "the vault code is 7781"
STEPS = 10
READ_CALL_ID = tool_call_id("read", 1)
POINTER = re.compile(r"Tool result offloaded to text \(\d+ characters\) at '([^']+)'\. Preview: results for step 1 ")


def research(step: int) -> str:
    """A bulky result; step 1's ends with a fact far past any preview."""
    return search_result(step, 0) + (f" Appendix: {NEEDLE}." if step == 1 else "")


SEARCH = Tool(
    name="search",
    description="Search the corpus for the given step.",
    parameters={"type": "object", "properties": {"step": {"type": "integer"}}, "required": ["step"]},
    function=research,
)


def read_tool(store: FileSystemToolResultStore) -> Tool:
    """Haystack's read tool for offloaded results, as its offload compactor documents it: scoped to one store."""

    @tool
    def read_offloaded_result(path: Annotated[str, "Path of an offloaded tool result"]) -> str:
        """Read back the full content of an offloaded tool result."""
        content = store.read(path)
        if isinstance(content, bytes):
            return f"'{path}' holds {len(content)} bytes of binary content and cannot be read as text."
        return content

    return read_offloaded_result


def researcher(request: dict[str, Any]) -> Reply:
    """Search step by step; read step 1 back once it is a reference; answer from what was read."""
    messages: list[dict[str, Any]] = request["messages"]
    last = messages[-1]
    if last.get("tool_call_id") == READ_CALL_ID:
        return Reply(content="done: " + (NEEDLE if NEEDLE in last["content"] else "not found"))
    for message in messages:
        found = POINTER.search(message["content"]) if message["role"] == "tool" else None
        if found:
            arguments = json.dumps({"path": found.group(1)})
            return Reply(tool_calls=(ToolCall(id=READ_CALL_ID, name="read_offloaded_result", arguments=arguments),))
    step = 1 + sum(1 for message in messages if message["role"] == "assistant" and message.get("tool_calls"))
    if step > STEPS:
        return Reply(content="done: nothing was offloaded")
    arguments = json.dumps({"step": step})
    return Reply(tool_calls=(ToolCall(id=tool_call_id("step", step), name="search", arguments=arguments),))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_agent_reads_an_offloaded_result_back_and_answers_from_it(tmp_path: Path, mode: str) -> None:
    store = FileSystemToolResultStore(root=tmp_path)
    compactor = ChainCompactor(
        [ToolResultOffloadCompactor(store=store), ToolResultPruningCompactor(), SlidingWindowCompactor()]
    )
    hook = CompactionHook(compactor=compactor, context_window=4096, token_counter=TiktokenTokenCounter())
    with running_upstream(researcher, context_window=4096) as upstream:
        agent = Agent(
            chat_generator=generator_for(upstream),
            tools=[SEARCH, read_tool(store)],
            system_prompt="You are a careful research agent.",
            hooks={"before_llm": [hook]},
        )
        task = [ChatMessage.from_user("Find the vault code in the research.")]
        result = agent.run(messages=task) if mode == "sync" else asyncio.run(agent.run_async(messages=task))
        requests = upstream.chat_requests

    assert result["last_message"].text == f"done: {NEEDLE}"
    for request in requests:
        assert_pairs_intact(request["messages"])
    asked_to_read = next(index for index, request in enumerate(requests) if _pointer_in(request))
    assert not any(NEEDLE in str(m.get("content")) for m in requests[asked_to_read]["messages"]), "step 1 was offloaded"
    read_back = requests[-1]["messages"][-1]
    assert read_back["tool_call_id"] == READ_CALL_ID
    assert read_back["content"] == research(1), "the read tool gave the whole result back"
    reference = _pointer_in(requests[-1])
    assert reference is not None and Path(reference).parent == tmp_path.resolve()
    assert not any("was removed to free up context" in str(m.get("content")) for r in requests for m in r["messages"])


def _pointer_in(request: dict[str, Any]) -> str | None:
    """The reference to step 1's offloaded result in the request, if it holds one."""
    for message in request["messages"]:
        found = POINTER.search(message["content"]) if message["role"] == "tool" else None
        if found:
            return found.group(1)
    return None
