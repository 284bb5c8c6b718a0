"""The fake Anthropic upstream is as strict as the Messages API, as seen by the official `anthropic` SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest
from anthropic import AsyncAnthropic

from proxy.simulator.anthropic_upstream import AnthropicUpstream, tool_loop_responder

MODEL = "claude-sonnet-4-5"
BINDING = "claude-fable-5-1"
TOOLS: list[Any] = [{"name": "search", "description": "Search.", "input_schema": {"type": "object", "properties": {}}}]
THINKING: Any = {"type": "enabled", "budget_tokens": 1024}


@pytest.fixture
async def upstream() -> AsyncIterator[AnthropicUpstream]:
    async with AnthropicUpstream(context_window=8000, context_windows={"claude-3": 6000}) as fake:
        yield fake


@pytest.fixture
async def client(upstream: AnthropicUpstream) -> AsyncIterator[AsyncAnthropic]:
    async with AsyncAnthropic(base_url=upstream.base_url, api_key="sk-ant-test", max_retries=0) as sdk:
        yield sdk


async def turn(client: AsyncAnthropic, model: str, messages: list[Any], **extra: Any) -> Any:
    return await client.messages.create(
        model=model, max_tokens=2000, tools=TOOLS, thinking=THINKING, messages=messages, **extra
    )


async def tool_round(client: AsyncAnthropic, model: str) -> list[Any]:
    """A user turn, the model's thinking and call, its result: the messages of a turn being continued."""
    messages: list[Any] = [{"role": "user", "content": "Find it."}]
    first = await turn(client, model, messages)
    assert [block.type for block in first.content] == ["thinking", "tool_use"]
    call = first.content[1]
    messages.append({"role": "assistant", "content": [block.model_dump() for block in first.content]})
    messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "42"}]})
    return messages


async def rejected(client: AsyncAnthropic, model: str, messages: list[Any], **extra: Any) -> str:
    with pytest.raises(anthropic.BadRequestError) as caught:
        await turn(client, model, messages, **extra)
    body: Any = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    return str(body["error"]["message"])


@pytest.mark.parametrize("model", [MODEL, BINDING])
async def test_a_tool_loop_with_thinking_runs_and_reports_usage(client: AsyncAnthropic, model: str) -> None:
    messages = await tool_round(client, model)
    answer = await turn(client, model, messages)
    assert [block.type for block in answer.content] == ["thinking", "text"]
    assert answer.usage.input_tokens > 0 and answer.usage.output_tokens > 0


async def test_the_stream_is_the_full_event_sequence_with_usage(client: AsyncAnthropic) -> None:
    messages = await tool_round(client, MODEL)
    kinds: list[str] = []
    async with client.messages.stream(
        model=MODEL, max_tokens=2000, tools=TOOLS, thinking=THINKING, messages=messages
    ) as stream:
        async for event in stream:
            kinds.append(event.type)
        final = await stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(kinds)
    assert final.content[0].type == "thinking" and final.content[0].signature
    assert final.usage.output_tokens > 1
    again = await turn(client, MODEL, [*messages, {"role": "assistant", "content": final.content}, *NEXT])
    assert again.content


NEXT: list[Any] = [{"role": "user", "content": "Thanks."}]


async def test_unpaired_and_misplaced_tool_results_are_refused(client: AsyncAnthropic) -> None:
    messages = await tool_round(client, MODEL)
    unanswered = [*messages[:2], {"role": "user", "content": "never mind"}]
    assert "`tool_use` ids were found without `tool_result` blocks immediately after" in await rejected(
        client, MODEL, unanswered
    )
    late = [*messages[:2], {"role": "user", "content": [{"type": "text", "text": "x"}, *messages[2]["content"]]}]
    assert "Did not find 1 `tool_result` block(s) at the beginning of this message" in await rejected(
        client, MODEL, late
    )
    orphan = [{"role": "user", "content": messages[2]["content"]}]
    assert "unexpected `tool_use_id` found in `tool_result` blocks" in await rejected(client, MODEL, orphan)


async def test_more_than_four_breakpoints_are_refused(client: AsyncAnthropic) -> None:
    marked = [{"type": "text", "text": f"part {n}", "cache_control": {"type": "ephemeral"}} for n in range(5)]
    message = await rejected(client, MODEL, [{"role": "user", "content": marked}])
    assert message == "A maximum of 4 blocks with cache_control may be provided. Found 5."


async def test_thinking_must_verify_and_stay_bound_to_its_prefix(client: AsyncAnthropic) -> None:
    for model in (MODEL, BINDING):
        messages = await tool_round(client, model)
        altered = {**messages[1]["content"][0], "thinking": "something else"}
        tampered = [messages[0], {"role": "assistant", "content": [altered, messages[1]["content"][1]]}, messages[2]]
        assert (await rejected(client, model, tampered)).endswith("Invalid `signature` in `thinking` block")
        moved = [{"role": "user", "content": "Find it, please."}, *messages[1:]]
        if model == MODEL:
            assert (await turn(client, model, moved)).content
            continue
        assert "The block is bound to a different conversation" in await rejected(client, model, moved)
        binding = {"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "drop_block"}}
        assert "requires the `anthropic-beta" in await rejected(client, model, moved, extra_body={"thinking": binding})
        headers = {"anthropic-beta": "thinking-binding-controls-2026-08-01"}
        assert (await turn(client, model, moved, extra_body={"thinking": binding}, extra_headers=headers)).content


async def test_counting_runs_the_same_thinking_checks_as_creating(client: AsyncAnthropic) -> None:
    """The API documents that `count_tokens` runs the thinking blocks' prefix check and refuses with the same 400."""
    messages = await tool_round(client, BINDING)
    moved = [{"role": "user", "content": "Find it, please."}, *messages[1:]]
    created = await rejected(client, BINDING, moved)
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.count_tokens(model=BINDING, tools=TOOLS, thinking=THINKING, messages=moved)
    body: Any = caught.value.body
    assert body["error"]["message"] == created and "The block is bound to a different conversation" in created
    counted = await client.messages.count_tokens(model=BINDING, tools=TOOLS, thinking=THINKING, messages=messages)
    assert counted.input_tokens > 0


async def test_the_prefix_is_every_earlier_message_with_its_fields_but_not_cache_control(
    client: AsyncAnthropic,
) -> None:
    """As documented, a mid-conversation system message is in the prefix, every field of it; breakpoints are not."""
    steer: Any = {"role": "system", "content": [{"type": "text", "text": "Brief."}], "output_config": {"effort": "low"}}
    user: Any = {"role": "user", "content": "Find it."}
    first = await turn(client, BINDING, [user, steer])
    call = first.content[1]
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "42"}]}
    after = [{"role": "assistant", "content": [block.model_dump() for block in first.content]}, result]
    assert (await turn(client, BINDING, [user, steer, *after])).content
    marked = {**steer, "content": [{**steer["content"][0], "cache_control": {"type": "ephemeral"}}]}
    assert (await turn(client, BINDING, [user, marked, *after])).content
    assert (await turn(client, BINDING, [user, {**steer, "content": "Brief."}, *after])).content
    for changed in ({**steer, "output_config": {"effort": "high"}}, {**steer, "content": [*steer["content"], TEXT]}):
        refused = await rejected(client, BINDING, [user, changed, *after])
        assert "The block is bound to a different conversation" in refused


TEXT: Any = {"type": "text", "text": "Then list what you need next."}


async def test_overflow_is_refused_with_the_api_texts(client: AsyncAnthropic) -> None:
    long = [{"role": "user", "content": "word " * 9000}]
    assert (await rejected(client, MODEL, long)).startswith("prompt is too long: ")
    assert "tokens > 8000 maximum" in await rejected(client, MODEL, long)
    legacy = await rejected(client, "claude-3-5-sonnet-20241022", [{"role": "user", "content": "word " * 5000}])
    assert legacy.startswith("input length and `max_tokens` exceed context limit: ") and "+ 2000 > 6000" in legacy


async def test_cache_reads_follow_the_prefix_rule_at_breakpoints(upstream: AnthropicUpstream) -> None:
    upstream.responder = tool_loop_responder(tool=None)
    async with AsyncAnthropic(base_url=upstream.base_url, api_key="sk-ant-test", max_retries=0) as client:
        system: Any = [{"type": "text", "text": "rules " * 1500, "cache_control": {"type": "ephemeral"}}]
        first = await client.messages.create(model=MODEL, max_tokens=100, system=system, messages=NEXT)
        assert first.usage.cache_creation_input_tokens and not first.usage.cache_read_input_tokens
        second = await client.messages.create(model=MODEL, max_tokens=100, system=system, messages=NEXT)
        assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
        other: Any = [{"type": "text", "text": "other " * 1500, "cache_control": {"type": "ephemeral"}}]
        third = await client.messages.create(model=MODEL, max_tokens=100, system=other, messages=NEXT)
        assert not third.usage.cache_read_input_tokens


async def test_count_tokens_matches_what_a_message_counts(client: AsyncAnthropic) -> None:
    messages: Any = [{"role": "user", "content": "How many tokens is this?"}]
    counted = await client.messages.count_tokens(model=MODEL, messages=messages)
    answer = await client.messages.create(model=MODEL, max_tokens=100, messages=messages)
    assert counted.input_tokens == answer.usage.input_tokens
