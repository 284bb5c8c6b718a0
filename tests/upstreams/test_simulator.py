"""The simulated model (`proxy.simulator.model.Simulator`): three formats on one port, seen by the official SDKs.

It calls the first tool each request offers with arguments made from its schema, answers in text once it made its
calls (or when offered none), reports cached tokens for a repeated prefix, refuses a prompt over its window with
each provider's own error, and lists its window on `/v1/models` for a proxy to discover.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from anthropic import AsyncAnthropic
from hypothesis import given
from hypothesis import strategies as st
from openai import AsyncOpenAI

from proxy.simulator.model import Simulator, offered_tool, tool_arguments

WINDOW = 4000
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "line": {"type": "integer"}, "verbose": {"type": "boolean"}},
    "required": ["path", "line"],
}
CHAT_TOOLS: Any = [{"type": "function", "function": {"name": "read_file", "parameters": SCHEMA}}]
RESPONSES_TOOLS: Any = [{"type": "function", "name": "read_file", "parameters": SCHEMA}]
MESSAGES_TOOLS: Any = [{"name": "read_file", "description": "Read a file.", "input_schema": SCHEMA}]
LONG = "word " * 5000


@pytest.fixture
async def simulator() -> AsyncIterator[Simulator]:
    async with Simulator(context_window=WINDOW, steps=2) as model:
        yield model


@pytest.fixture
async def chat(simulator: Simulator) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=simulator.base_url + "/v1", api_key="sk-test", max_retries=0) as client:
        yield client


async def test_chat_calls_the_offered_tool_then_answers(chat: AsyncOpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "Read the files."}]
    for step in (1, 2):
        completion = await chat.chat.completions.create(model="gpt-4.1-mini", messages=messages, tools=CHAT_TOOLS)
        message = completion.choices[0].message
        assert completion.choices[0].finish_reason == "tool_calls" and message.tool_calls
        call: Any = message.tool_calls[0]
        assert call.function.name == "read_file"
        assert json.loads(call.function.arguments) == {"path": f"path-1-{step}", "line": step}
        messages += [message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "x"}]
    answer = await chat.chat.completions.create(model="gpt-4.1-mini", messages=messages, tools=CHAT_TOOLS)
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].message.content


async def test_chat_answers_in_text_when_tool_choice_is_none(chat: AsyncOpenAI) -> None:
    messages: Any = [{"role": "user", "content": "Summarize what you did."}]
    completion = await chat.chat.completions.create(
        model="gpt-4.1-mini", messages=messages, tools=CHAT_TOOLS, tool_choice="none"
    )
    assert completion.choices[0].finish_reason == "stop" and not completion.choices[0].message.tool_calls


async def test_chat_reports_cached_tokens_for_a_repeated_prefix_and_refuses_an_overflow(chat: AsyncOpenAI) -> None:
    prefix: Any = [{"role": "system", "content": "word " * 1500}]
    usages = []
    for question in ("a", "b"):
        messages = [*prefix, {"role": "user", "content": question}]
        completion = await chat.chat.completions.create(model="gpt-4.1-mini", messages=messages)
        assert completion.usage is not None and completion.usage.prompt_tokens_details is not None
        usages.append((completion.usage.prompt_tokens, completion.usage.prompt_tokens_details.cached_tokens))
    (_, none_cached), (second, cached) = usages
    assert none_cached == 0
    # The system message (about 1,500 tokens) is read from the cache, in whole 128-token blocks.
    assert 1500 - 128 < cached < second and cached % 128 == 0
    with pytest.raises(openai.BadRequestError) as refused:
        await chat.chat.completions.create(model="gpt-4.1-mini", messages=[{"role": "user", "content": LONG}])
    assert refused.value.code == "context_length_exceeded"
    assert f"maximum context length is {WINDOW} tokens" in refused.value.message


async def test_responses_calls_the_offered_tool_streamed(chat: AsyncOpenAI) -> None:
    stream = await chat.responses.create(
        model="gpt-4.1-mini", input="Read the files.", tools=RESPONSES_TOOLS, stream=True
    )
    events = [event async for event in stream]
    completed: Any = events[-1]
    assert completed.type == "response.completed"
    (call,) = [item for item in completed.response.output if item.type == "function_call"]
    assert call.name == "read_file" and json.loads(call.arguments) == {"path": "path-1-1", "line": 1}


async def test_messages_calls_the_offered_tool_and_refuses_an_overflow(simulator: Simulator) -> None:
    async with AsyncAnthropic(base_url=simulator.base_url, api_key="sk-ant-test", max_retries=0) as client:
        message = await client.messages.create(
            model="claude-sonnet-4-5",
            max_tokens=100,
            tools=MESSAGES_TOOLS,
            messages=[{"role": "user", "content": "Read the files."}],
        )
        (call,) = [block for block in message.content if block.type == "tool_use"]
        assert call.name == "read_file" and call.input == {"path": "path-1-1", "line": 1}
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(
                model="claude-sonnet-4-5", max_tokens=100, messages=[{"role": "user", "content": LONG}]
            )
    assert "prompt is too long" in refused.value.message and f"> {WINDOW} maximum" in refused.value.message


async def test_models_are_listed_with_the_window(simulator: Simulator) -> None:
    async with aiohttp.ClientSession() as http, http.get(simulator.base_url + "/v1/models") as response:
        listed = await response.json()
    assert listed["data"] and all(model["max_model_len"] == WINDOW for model in listed["data"])


NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
TYPES = st.sampled_from(["string", "integer", "number", "boolean", "array", "object"])


@given(
    properties=st.dictionaries(NAMES, TYPES, max_size=6),
    data=st.data(),
    turn=st.integers(1, 50),
    step=st.integers(1, 50),
)
def test_arguments_give_each_required_property_a_value_of_its_type(
    properties: dict[str, str], data: st.DataObject, turn: int, step: int
) -> None:
    required = data.draw(st.lists(st.sampled_from(sorted(properties)), unique=True) if properties else st.just([]))
    schema = {"type": "object", "properties": {name: {"type": kind} for name, kind in properties.items()}}
    arguments = tool_arguments({**schema, "required": required}, turn, step)
    assert set(arguments) == set(required)
    python = {"string": str, "integer": int, "number": int, "boolean": bool, "array": list, "object": dict}
    assert all(isinstance(arguments[name], python[properties[name]]) for name in required)
    assert set(tool_arguments(schema, turn, step)) == set(properties)  # nothing required: every property


@given(position=st.integers(0, 3), shape=st.sampled_from(["chat", "responses", "messages"]))
def test_the_first_function_tool_is_found_in_every_format(position: int, shape: str) -> None:
    declared = {
        "chat": {"type": "function", "function": {"name": "wanted", "parameters": SCHEMA}},
        "responses": {"type": "function", "name": "wanted", "parameters": SCHEMA},
        "messages": {"name": "wanted", "input_schema": SCHEMA},
    }[shape]
    tools: list[Any] = [{"type": "web_search"}] * position + [declared, {"type": "function", "name": "later"}]
    assert offered_tool(tools) == ("wanted", SCHEMA)
    assert offered_tool(tools, {"type": "none"} if shape == "messages" else "none") is None
