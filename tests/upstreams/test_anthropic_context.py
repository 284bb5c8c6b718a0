"""The fake Anthropic upstream's context management, read by the official `anthropic` SDK as the API's would be.

Tool-result clearing reports `context_management.applied_edits` and the usage of what the model read; compaction opens
the reply with a `compaction` block (or stops there with `pause_after_compaction`), reports its iteration in
`usage.iterations`, and on the next request reads from that block on: streamed and not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest
from anthropic import AsyncAnthropic

from proxy.simulator.anthropic_context import COMPACTION_BETA, EDITING_BETA
from proxy.simulator.anthropic_upstream import AnthropicUpstream, tool_loop_responder

MODEL = "claude-sonnet-4-5"
TOOLS: list[Any] = [{"name": "search", "description": "Search.", "input_schema": {"type": "object"}}]


@pytest.fixture
async def client() -> AsyncIterator[AsyncAnthropic]:
    async with (
        AnthropicUpstream(context_window=1_000_000, responder=tool_loop_responder("search", steps=3)) as fake,
        AsyncAnthropic(base_url=fake.base_url, api_key="sk-ant-test", max_retries=0) as sdk,
    ):
        yield sdk


def tool_run(calls: int, words: int) -> list[dict[str, Any]]:
    """A task, then `calls` calls of `search` each answered with `words` words."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Look it up."}]
    for call in range(calls):
        use = {"type": "tool_use", "id": f"toolu_{call}", "name": "search", "input": {"q": call}}
        messages.append({"role": "assistant", "content": [use]})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{call}", "content": "found " * words}
        messages.append({"role": "user", "content": [result]})
    return messages


async def create(client: AsyncAnthropic, streamed: bool, **fields: Any) -> Any:
    if streamed:
        async with client.beta.messages.stream(model=MODEL, max_tokens=256, tools=TOOLS, **fields) as stream:
            return await stream.get_final_message()
    return await client.beta.messages.create(model=MODEL, max_tokens=256, tools=TOOLS, **fields)


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
async def test_clearing_reports_what_it_cleared_and_the_usage_of_what_was_read(
    client: AsyncAnthropic, streamed: bool
) -> None:
    messages = tool_run(6, 500)
    management = {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 1000}}]}
    plain = await create(client, streamed, messages=messages)
    cleared = await create(client, streamed, messages=messages, context_management=management, betas=[EDITING_BETA])
    assert cleared.context_management is not None
    [applied] = cleared.context_management.applied_edits
    assert applied.type == "clear_tool_uses_20250919" and applied.cleared_tool_uses == 3  # all but the latest 3
    assert cleared.usage.input_tokens == plain.usage.input_tokens - applied.cleared_input_tokens
    assert applied.cleared_input_tokens > 3 * 490  # three results of 500 words, each left a placeholder


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
async def test_compaction_opens_the_reply_and_is_read_from_on_the_next_request(
    client: AsyncAnthropic, streamed: bool
) -> None:
    messages = tool_run(2, 30_000)
    management = {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50_000}}]}
    asked = {"context_management": management, "betas": [COMPACTION_BETA]}
    compacted = await create(client, streamed, messages=messages, **asked)
    assert compacted.content[0].type == "compaction" and compacted.content[0].content
    kinds = [iteration.type for iteration in compacted.usage.iterations]
    assert kinds == ["compaction", "message"]
    assert compacted.usage.iterations[0].input_tokens > 50_000 > compacted.usage.input_tokens
    history = [
        *messages,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in compacted.content]},
    ]
    history.append(
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": compacted.content[-1].id, "content": "ok"}]}
    )
    following = await create(client, streamed, messages=history, **asked)
    assert following.usage.iterations is None and following.usage.input_tokens < 1_000


async def test_pause_after_compaction_stops_at_the_compaction_block(client: AsyncAnthropic) -> None:
    edit = {
        "type": "compact_20260112",
        "trigger": {"type": "input_tokens", "value": 50_000},
        "pause_after_compaction": True,
    }
    paused = await create(
        client, False, messages=tool_run(2, 30_000), context_management={"edits": [edit]}, betas=[COMPACTION_BETA]
    )
    assert paused.stop_reason == "compaction"
    assert [block.type for block in paused.content] == ["compaction"]
    assert [iteration.type for iteration in paused.usage.iterations] == ["compaction"]


async def test_a_malformed_edit_gets_the_apis_400(client: AsyncAnthropic) -> None:
    edit = {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": "three"}}
    with pytest.raises(anthropic.BadRequestError, match=r"keep\.value"):
        await create(client, False, messages=tool_run(1, 5), context_management={"edits": [edit]}, betas=[EDITING_BETA])
