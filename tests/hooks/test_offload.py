"""`ToolResultOffloadCompactor` in our hook, in our chain, in Haystack's hook; images, failures and replays."""

from __future__ import annotations

import base64
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from haystack.components.agents import Agent
from haystack.core.serialization import allow_deserialization_module, default_from_dict, default_to_dict
from haystack.dataclasses import ChatMessage, ImageContent, TextContent, ToolCall
from haystack.hooks.compaction import CompactionHook as HaystackHook
from haystack.hooks.tool_result_offloading import FileSystemToolResultStore
from haystack.token_counters.utils import _rendered_conversation

from hooks.compaction import (
    ChainCompactor,
    CompactionHook,
    SlidingWindowCompactor,
    ToolResultOffloadCompactor,
    ToolResultPruningCompactor,
)
from hooks.compaction.offload import ToolResultStoreAdapter
from proxy.engine import COMPACTION_META_KEY, ApproximateCounter, ToolResultOffload, Transcript
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.hooks.conftest import agent_for, long_conversation, search_result, state_with

pytestmark = pytest.mark.filterwarnings("ignore::haystack.utils.experimental.ExperimentalWarning")

OFFLOADED = "tool_result_offloaded"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(3000)).decode()


class TextOnlyStore:
    """A `ToolResultStore` that holds text in memory and cannot take images or files."""

    supports_binary_content = False

    def __init__(self) -> None:
        self.held: dict[str, str | bytes] = {}

    def write(self, *, key: str, content: str | bytes) -> str:
        self.held[key] = content
        return key

    def read(self, reference: str) -> str | bytes:
        return self.held[reference]

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TextOnlyStore:
        return default_from_dict(cls, data)


class BrokenStore(TextOnlyStore):
    """A store whose writes fail, as a full disk would."""

    def write(self, *, key: str, content: str | bytes) -> str:
        raise OSError("disk full")


class PayloadCounter:
    """A Haystack counter charging images their base64 payload, as a provider-side counter would (4 chars a token)."""

    def count(self, messages: list[ChatMessage], tools: Any = None) -> int:
        def payload(part: Any) -> str:
            return str(getattr(part, "base64_image", "")) or type(part).__name__

        return len(_rendered_conversation(messages, placeholder=payload)) // 4


def _image_step(step: int) -> list[ChatMessage]:
    call = ToolCall(id=f"img_{step}", tool_name="render", arguments={"step": step})
    result = [TextContent("chart for step"), ImageContent(base64_image=PNG, mime_type="image/png")]
    return [ChatMessage.from_assistant(tool_calls=[call]), ChatMessage.from_tool(tool_result=result, origin=call)]


def _offloaded(messages: list[ChatMessage]) -> list[ChatMessage]:
    return [message for message in messages if OFFLOADED in message.meta]


def test_our_hook_offloads_older_results_and_the_store_gives_them_back(tmp_path: Path) -> None:
    store = FileSystemToolResultStore(root=tmp_path)
    messages = long_conversation(8)
    state = state_with(messages)
    hook = CompactionHook(compactor=ToolResultOffloadCompactor(store=store), context_window=8192)

    hook.run(state)

    compacted = state.data["messages"]
    offloaded = _offloaded(compacted)
    assert len(compacted) == len(messages) and offloaded
    for message in offloaded:
        result = message.tool_call_result
        assert result is not None and result.result.startswith("Tool result offloaded to text")
        step = message.meta["step"]  # the original's meta is carried over
        assert store.read(message.meta[OFFLOADED][0]) == search_result(step, 0)
        assert result.origin.id == f"call_{step}"
    assert compacted[-1] is messages[-1], "the newest step keeps its result"


def test_in_a_chain_results_are_offloaded_before_anything_is_pruned_and_stay_references(tmp_path: Path) -> None:
    store = FileSystemToolResultStore(root=tmp_path)
    compactor = ChainCompactor(
        [ToolResultOffloadCompactor(store=store), ToolResultPruningCompactor(), SlidingWindowCompactor()]
    )
    hook = CompactionHook(compactor=compactor, context_window=8192)
    state = state_with(long_conversation(12))

    hook.run(state)
    first = _offloaded(state.data["messages"])
    state.set("messages", [*state.data["messages"], *long_conversation(24)[26:]])
    hook.run(state)

    strategies = {
        m.meta[COMPACTION_META_KEY]["strategy"] for m in state.data["messages"] if COMPACTION_META_KEY in m.meta
    }
    assert first and "tool_result_pruning" not in strategies
    for message in _offloaded(state.data["messages"]):
        result = message.tool_call_result
        assert result is not None and message.meta[OFFLOADED][0] in result.result
        assert store.read(message.meta[OFFLOADED][0]).startswith("results for step")
    survivors = {m.tool_call_result.origin.id for m in state.data["messages"] if m.tool_call_result}
    for message in first:
        if message.tool_call_result.origin.id in survivors:
            assert message in state.data["messages"], "a later compaction rewrote an offloaded result"


def test_our_compactor_works_in_haystacks_hook(tmp_path: Path) -> None:
    store = FileSystemToolResultStore(root=tmp_path)
    hook = HaystackHook(compactor=ToolResultOffloadCompactor(store=store), context_window=8192)
    state = state_with(long_conversation(8))

    hook.run(state)

    offloaded = _offloaded(state.data["messages"])
    assert offloaded
    assert store.read(offloaded[0].meta[OFFLOADED][0]) == search_result(1, 0)


class ThreadRecordingStore(FileSystemToolResultStore):
    """The file-system store, remembering which thread each write ran on."""

    def __init__(self, root: Path) -> None:
        super().__init__(root=root)
        self.threads: set[int] = set()

    def write(self, *, key: str, content: str | bytes) -> str:
        self.threads.add(threading.get_ident())
        return super().write(key=key, content=content)


@pytest.mark.asyncio
async def test_async_runs_write_off_the_event_loop_and_match_sync(tmp_path: Path) -> None:
    messages = long_conversation(8)
    sync_store, async_store = ThreadRecordingStore(tmp_path / "sync"), ThreadRecordingStore(tmp_path / "async")
    CompactionHook(compactor=ToolResultOffloadCompactor(store=sync_store), context_window=8192).run(
        state_with(list(messages))
    )
    await CompactionHook(compactor=ToolResultOffloadCompactor(store=async_store), context_window=8192).run_async(
        state_with(list(messages))
    )

    written = sorted(path.name for path in (tmp_path / "sync").iterdir())
    assert written and written == sorted(path.name for path in (tmp_path / "async").iterdir())
    assert async_store.threads and threading.get_ident() not in async_store.threads


def test_compacting_the_same_conversation_again_writes_the_same_references(tmp_path: Path) -> None:
    store = FileSystemToolResultStore(root=tmp_path)
    runs = []
    for _ in range(2):
        state = state_with(long_conversation(8))
        CompactionHook(compactor=ToolResultOffloadCompactor(store=store), context_window=8192).run(state)
        runs.append([m.tool_call_result.result for m in _offloaded(state.data["messages"])])

    assert runs[0] and runs[0] == runs[1]
    assert len(list(tmp_path.iterdir())) == len(runs[0])


def test_images_go_to_a_binary_store_through_our_hook(tmp_path: Path) -> None:
    store = FileSystemToolResultStore(root=tmp_path)
    messages = [ChatMessage.from_user("draw"), *_image_step(1), *_image_step(2)]
    hook = CompactionHook(
        compactor=ToolResultOffloadCompactor(store=store, min_tokens=0),
        context_window=1000,
        token_counter=PayloadCounter(),
    )
    state = state_with(messages)

    hook.run(state)

    (offloaded,) = _offloaded(state.data["messages"])
    text_reference, image_reference = offloaded.meta[OFFLOADED]
    assert store.read(text_reference) == "chart for step"
    assert store.read(image_reference) == base64.b64decode(PNG)
    assert offloaded.tool_call_result is not None
    assert offloaded.tool_call_result.result.startswith("Tool result offloaded to 2 files:")


def test_images_stay_when_the_store_takes_only_text(caplog: pytest.LogCaptureFixture) -> None:
    store = TextOnlyStore()
    messages = [ChatMessage.from_user("draw"), *_image_step(1), *_image_step(2)]
    compactor = ToolResultOffloadCompactor(store=store, min_tokens=0)

    with caplog.at_level(logging.WARNING):
        assert compactor.compact(messages, target_tokens=1, token_counter=PayloadCounter()) is None

    assert "does not support binary content" in caplog.text
    assert not store.held


def test_a_failed_write_keeps_the_result_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    messages = long_conversation(4)
    with caplog.at_level(logging.WARNING):
        compacted = ToolResultOffloadCompactor(store=BrokenStore()).compact(messages, 1, PayloadCounter())

    assert compacted is None
    assert "Failed to offload the result of tool 'search'" in caplog.text


def test_error_results_stay() -> None:
    call = ToolCall(id="e1", tool_name="search", arguments={})
    messages = [
        ChatMessage.from_user("go"),
        ChatMessage.from_assistant(tool_calls=[call]),
        ChatMessage.from_tool(tool_result="failure " * 400, origin=call, error=True),
        *long_conversation(1)[2:],
    ]
    store = TextOnlyStore()
    assert ToolResultOffloadCompactor(store=store, min_tokens=0).compact(messages, 1, PayloadCounter()) is None
    assert not store.held


def test_an_agent_carrying_the_compactor_round_trips(tmp_path: Path, long_task_upstream: OpenAIUpstream) -> None:
    compactor = ChainCompactor(
        [ToolResultOffloadCompactor(store=FileSystemToolResultStore(root=tmp_path), min_tokens=7)]
    )
    agent = agent_for(long_task_upstream, CompactionHook(compactor=compactor, context_window=8192))

    allow_deserialization_module("tests.hooks.conftest")  # the test's tool function; the compactor needs no entry
    restored = Agent.from_dict(agent.to_dict())

    (offload,) = restored.hooks["before_llm"][0].compactor.compactors
    assert isinstance(offload, ToolResultOffloadCompactor) and offload.min_tokens == 7
    assert isinstance(offload.store, FileSystemToolResultStore) and offload.store.root == tmp_path


def test_any_haystack_store_serves_the_engine_strategy_too(tmp_path: Path) -> None:
    adapter = ToolResultStoreAdapter(FileSystemToolResultStore(root=tmp_path))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for step in (1, 2):
        call = {"id": f"c{step}", "type": "function", "function": {"name": "search", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{step}", "content": search_result(step, 0)},
        ]
    plan = ToolResultOffload(adapter).plan(Transcript(messages, ApproximateCounter()), 1)

    assert plan is not None
    (entry,) = plan.created()
    assert adapter.get(entry.meta[OFFLOADED][0]) == search_result(1, 0)
    assert adapter.get(str(tmp_path / "missing.txt")) is None
