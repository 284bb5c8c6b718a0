"""The fake upstream's Responses API is as strict as OpenAI's, as seen by the official SDK and by plain HTTP."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI
from openai.types.responses import (
    Response,
    ResponseCompactionItem,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseReasoningItem,
)

from proxy.simulator.openai_upstream import OpenAIUpstream
from proxy.simulator.responses_api import (
    FunctionCall,
    ResponsesReply,
    default_responses_responder,
    responses_tool_loop_responder,
)
from proxy.simulator.responses_items import check_pairing
from proxy.simulator.responses_tokens import prompt_sequence, truncate_to_fit
from tests.support.examples import examples

MODEL = "gpt-4.1"
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "search",
        "description": "Search the corpus.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
]
OVERFLOW_MESSAGE = "Your input exceeds the context window of this model. Please adjust your input and try again."


@pytest.fixture
async def upstream() -> AsyncIterator[OpenAIUpstream]:
    async with OpenAIUpstream(context_window=8192, responses_responder=responses_tool_loop_responder("search")) as up:
        yield up


@pytest.fixture
async def client(upstream: OpenAIUpstream) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=upstream.base_url + "/v1", api_key="sk-test", max_retries=0) as sdk:
        yield sdk


async def post(upstream: OpenAIUpstream, body: dict[str, Any]) -> tuple[int, Any]:
    """POST `body` to /v1/responses over plain HTTP: the status and the parsed JSON answer, byte-level exact."""
    async with aiohttp.ClientSession() as http, http.post(upstream.base_url + "/v1/responses", json=body) as answer:
        return answer.status, await answer.json()


def invalid(message: str, param: str | None = "input", code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


UNKNOWN = "unknown_parameter"


def type_error(param: str, expected: str, got: str) -> tuple[str, str, str]:
    return f"Invalid type for '{param}': expected {expected}, but got {got} instead.", param, "invalid_type"


def carried(response: Response) -> list[dict[str, Any]]:
    """The response's output items as a client carries them into the next request's input."""
    return [item.model_dump(exclude_none=True) for item in response.output]


def answers(response: Response) -> list[dict[str, Any]]:
    """A function_call_output for every call in `response`."""
    return [
        {"type": "function_call_output", "call_id": item.call_id, "output": f"result of {item.arguments}"}
        for item in response.output
        if isinstance(item, ResponseFunctionToolCall)
    ]


async def streamed(client: AsyncOpenAI, **params: Any) -> tuple[list[Any], Response]:
    events = [event async for event in await client.responses.create(stream=True, **params)]
    assert events[-1].type == "response.completed"
    return events, events[-1].response


async def test_an_agent_loop_carrying_items_forward_runs_and_the_sdk_parses_every_answer_and_event(
    upstream: OpenAIUpstream, client: AsyncOpenAI
) -> None:
    items: list[dict[str, Any]] = []
    params: dict[str, Any] = {"model": MODEL, "tools": TOOLS, "store": False}
    params["include"] = ["reasoning.encrypted_content"]
    for turn in range(3):
        items.append({"role": "user", "content": f"question {turn}"})
        for step in range(4):
            if (turn + step) % 2:
                events, response = await streamed(client, input=items, **params)
                assert [e.sequence_number for e in events] == list(range(len(events)))
                assert events[0].type == "response.created" and events[1].type == "response.in_progress"
                done = [e.item for e in events if e.type == "response.output_item.done"]
                assert [d.id for d in done] == [o.id for o in response.output]
            else:
                response = await client.responses.create(input=items, **params)
            assert response.status == "completed" and response.id.startswith("resp_")
            reasoning = response.output[0]
            assert isinstance(reasoning, ResponseReasoningItem) and reasoning.id.startswith("rs_")
            assert reasoning.encrypted_content
            assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens > 0
            items += carried(response) + answers(response)
            if step == 3:
                assert isinstance(response.output[1], ResponseOutputMessage)
                assert response.output_text == "done: 3 tool calls"
            else:
                call = response.output[1]
                assert isinstance(call, ResponseFunctionToolCall) and call.id and call.id.startswith("fc_")
                assert json.loads(call.arguments) == {"step": step + 1, "call": 0}
    assert len(upstream.responses_requests) == 12 == len(upstream.responses_usages)
    assert upstream.responses_requests[-1]["input"] == items[: len(upstream.responses_requests[-1]["input"])]


async def test_the_stream_of_a_reasoned_text_answer_is_openais_event_sequence(
    upstream: OpenAIUpstream, client: AsyncOpenAI
) -> None:
    upstream.responses_responder = lambda request: ResponsesReply(
        text="Hello there, friend.", reasoning=True, reasoning_summary="Greeting."
    )
    events, response = await streamed(client, model=MODEL, input="hi")
    kinds = [event.type for event in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        *["response.reasoning_summary_text.delta"] * kinds.count("response.reasoning_summary_text.delta"),
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * kinds.count("response.output_text.delta"),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert kinds.count("response.output_text.delta") > 1
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == response.output_text == "Hello there, friend."
    assert events[0].response.usage is None and events[0].response.status == "in_progress"
    assert response.usage is not None and response.usage.input_tokens > 0


async def test_streams_are_sse_with_event_lines_and_no_done_marker(upstream: OpenAIUpstream) -> None:
    body = {"model": MODEL, "input": "hi", "stream": True}
    async with aiohttp.ClientSession() as http, http.post(upstream.base_url + "/v1/responses", json=body) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = (await r.read()).decode()
    frames = raw.strip().split("\n\n")
    for frame in frames:
        event_line, data_line = frame.split("\n")
        assert event_line == f"event: {json.loads(data_line.removeprefix('data: '))['type']}"
    assert "[DONE]" not in raw


async def test_an_output_without_its_call_is_refused_with_openais_body(upstream: OpenAIUpstream) -> None:
    body = {
        "model": MODEL,
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "function_call_output", "call_id": "call_orphan", "output": "x"},
        ],
    }
    assert await post(upstream, body) == (
        400,
        invalid("No tool call found for function call output with call_id call_orphan."),
    )


async def test_a_call_without_its_output_is_refused_with_openais_body(upstream: OpenAIUpstream) -> None:
    call = {"type": "function_call", "call_id": "call_open", "name": "search", "arguments": "{}"}
    body = {"model": MODEL, "input": [{"role": "user", "content": "hi"}, call, {"role": "user", "content": "and?"}]}
    assert await post(upstream, body) == (400, invalid("No tool output found for function call call_open."))


async def test_a_call_without_the_reasoning_item_it_came_with_is_refused(
    upstream: OpenAIUpstream, client: AsyncOpenAI
) -> None:
    first = await client.responses.create(model=MODEL, input="find it", store=False)
    reasoning, call = carried(first)
    body = {"model": MODEL, "input": [{"role": "user", "content": "find it"}, call, *answers(first)]}
    assert await post(upstream, body) == (
        400,
        invalid(
            f"Item '{call['id']}' of type 'function_call' was provided without its required 'reasoning' item: "
            f"'{reasoning['id']}'."
        ),
    )
    body["input"][1] = {key: value for key, value in call.items() if key != "id"}  # a client that strips ids
    assert (await post(upstream, body))[0] == 200


async def test_a_reasoning_item_without_the_item_that_followed_it_is_refused(
    upstream: OpenAIUpstream, client: AsyncOpenAI
) -> None:
    upstream.responses_responder = lambda request: ResponsesReply(text="Sure.", reasoning=True)
    first = await client.responses.create(model=MODEL, input="hi", store=False)
    reasoning, message = carried(first)
    user = {"role": "user", "content": "hi"}
    body = {"model": MODEL, "input": [user, reasoning, {"role": "user", "content": "more"}]}
    assert await post(upstream, body) == (
        400,
        invalid(f"Item '{reasoning['id']}' of type 'reasoning' was provided without its required following item."),
    )
    body["input"] = [user, message]
    assert await post(upstream, body) == (
        400,
        invalid(
            f"Item '{message['id']}' of type 'message' was provided without its required 'reasoning' item: "
            f"'{reasoning['id']}'."
        ),
    )
    body["input"] = [user, reasoning, message, {"role": "user", "content": "more"}]
    assert (await post(upstream, body))[0] == 200


async def test_duplicate_ids_and_altered_encrypted_content_are_refused(
    upstream: OpenAIUpstream, client: AsyncOpenAI
) -> None:
    include: Any = ["reasoning.encrypted_content"]
    first = await client.responses.create(model=MODEL, input="find it", store=False, include=include)
    user = {"role": "user", "content": "find it"}
    reasoning, call = carried(first)
    body = {"model": MODEL, "input": [user, reasoning, call, *answers(first), reasoning]}
    assert await post(upstream, body) == (
        400,
        invalid(
            f"Duplicate item found with id {reasoning['id']}. Remove duplicate items from your input and try again."
        ),
    )
    content = reasoning["encrypted_content"]
    altered = {**reasoning, "encrypted_content": content[:-8] + ("A" if content[-8] != "A" else "B") + content[-7:]}
    body["input"] = [user, altered, call, *answers(first)]
    assert await post(upstream, body) == (
        400,
        invalid(
            f"The encrypted content for item {reasoning['id']} could not be verified. Reason: Encrypted content could "
            "not be decrypted or parsed.",
            None,
            "invalid_encrypted_content",
        ),
    )
    body["input"] = [user, reasoning, call, *answers(first)]
    assert (await post(upstream, body))[0] == 200


SUPPORTED_ITEM_TYPES = (
    "'additional_tools', 'agent_message', 'apply_patch_call', 'apply_patch_call_output', 'code_interpreter_call', "
    "'compaction', 'compaction_trigger', 'computer_call', 'computer_call_output', 'custom_tool_call', "
    "'custom_tool_call_output', 'file_search_call', 'function_call', 'function_call_output', 'image_generation_call', "
    "'item_reference', 'local_shell_call', 'local_shell_call_output', 'mcp_approval_request', 'mcp_approval_response', "
    "'mcp_call', 'mcp_list_tools', 'message', 'multi_agent_call', 'multi_agent_call_output', 'program', "
    "'program_output', 'reasoning', 'shell_call', 'shell_call_output', 'tool_search_call', 'tool_search_output', and "
    "'web_search_call'"
)
ROLES = "'assistant', 'system', 'developer', and 'user'"


@pytest.mark.parametrize(
    ("item", "status", "expected"),
    [
        (
            {"type": "bogus"},
            400,
            invalid(
                f"Invalid value: 'bogus'. Supported values are: {SUPPORTED_ITEM_TYPES}.", "input[1]", "invalid_value"
            ),
        ),
        (
            {"role": "robot", "content": "beep"},
            400,
            invalid(f"Invalid value: 'robot'. Supported values are: {ROLES}.", "input[1]", "invalid_value"),
        ),
        ({}, 400, invalid(f"Invalid value: ''. Supported values are: {ROLES}.", "input[1]", "invalid_value")),
        (
            7,
            400,
            invalid(
                "Invalid type for 'input[1]': expected an input item, but got an integer instead.",
                "input[1]",
                "invalid_type",
            ),
        ),
        (
            {"role": "user", "content": "x", "phase": "final_answer"},
            400,
            invalid("Unknown parameter: 'input[1].phase'.", "input[1].phase", "unknown_parameter"),
        ),
        (
            {"role": "user", "content": [{"type": "output_text", "text": "x"}]},
            400,
            invalid(
                "Invalid value: 'output_text'. Supported values are: 'input_text', 'input_image', 'input_file', "
                "'scoped_content', and 'input_audio'.",
                "input[1].content[0]",
                "invalid_value",
            ),
        ),
        (
            {"role": "assistant", "content": [{"type": "input_text", "text": "x"}]},
            400,
            invalid(
                "Invalid value: 'input_text'. Supported values are: 'output_text' and 'refusal'.",
                "input[1].content[0]",
                "invalid_value",
            ),
        ),
        (
            {"role": "user", "content": [{"type": "input_text"}]},
            400,
            invalid(
                "Missing required parameter: 'input[1].content[0].text'.",
                "input[1].content[0].text",
                "missing_required_parameter",
            ),
        ),
        (
            {"type": "function_call", "call_id": "c", "arguments": "{}"},
            400,
            invalid("Missing required parameter: 'input[1].name'.", "input[1].name", "missing_required_parameter"),
        ),
        (
            {"type": "function_call", "id": "call_1", "call_id": "call_1", "name": "f", "arguments": "{}"},
            400,
            invalid(
                "Invalid 'input[1].id': 'call_1'. Expected an ID that begins with 'fc'.", "input[1].id", "invalid_value"
            ),
        ),
        ({"type": "item_reference", "id": "msg_unknown"}, 404, invalid("Item with id 'msg_unknown' not found.", None)),
    ],
)
async def test_malformed_items_are_refused_with_openais_body(
    upstream: OpenAIUpstream, item: Any, status: int, expected: dict[str, Any]
) -> None:
    body = {"model": MODEL, "input": [{"role": "user", "content": "hi"}, item]}
    assert await post(upstream, body) == (status, expected)


async def test_known_item_kinds_are_accepted_and_counted(upstream: OpenAIUpstream, client: AsyncOpenAI) -> None:
    upstream.responses_responder = default_responses_responder
    items: list[Any] = [
        {"role": "system", "content": "be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "look"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "seen", "annotations": []}]},
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "q"}},
        {"type": "custom_tool_call", "call_id": "ct_1", "name": "grep", "input": "a.*b"},
        {"type": "custom_tool_call_output", "call_id": "ct_1", "output": "match"},
        {"role": "developer", "content": "go on"},
    ]
    response = await client.responses.create(model=MODEL, input=items)
    assert response.output_text == "ok 8 items"
    without_search = await client.responses.create(model=MODEL, input=[*items[:4], *items[5:]])
    assert response.usage is not None and without_search.usage is not None
    assert response.usage.input_tokens > without_search.usage.input_tokens + 10
    assert response.usage.input_tokens > 85  # the image alone costs 85


async def test_an_input_over_the_window_is_refused_with_the_responses_overflow_body() -> None:
    async with OpenAIUpstream(context_window=300) as upstream:
        fits = {"model": MODEL, "input": "word " * 200}
        assert (await post(upstream, fits))[0] == 200
        status, body = await post(upstream, {**fits, "max_output_tokens": 200})
        assert (status, body) == (400, invalid(OVERFLOW_MESSAGE, code="context_length_exceeded"))
        status, body = await post(upstream, {**fits, "input": "word " * 400, "stream": True})
        assert (status, body) == (400, invalid(OVERFLOW_MESSAGE, code="context_length_exceeded"))


async def test_the_overflow_can_come_inside_the_stream_as_some_openai_models_send_it() -> None:
    async with (
        OpenAIUpstream(context_window=300, responses_overflow_in_stream=True) as upstream,
        AsyncOpenAI(base_url=upstream.base_url + "/v1", api_key="sk-test", max_retries=0) as client,
    ):
        seen: list[str] = []
        with pytest.raises(openai.APIError, match="exceeds the context window"):
            async for event in await client.responses.create(model=MODEL, input="word " * 400, stream=True):
                seen.append(event.type)
        assert seen == ["response.created", "response.in_progress"]
        assert upstream.responses_usages == []


async def test_cached_tokens_grow_with_a_stable_prefix_and_drop_when_an_early_item_changes(
    client: AsyncOpenAI, upstream: OpenAIUpstream
) -> None:
    upstream.responses_responder = default_responses_responder
    instructions = " ".join(f"rule {n}: be exact." for n in range(300))
    items: list[dict[str, Any]] = []
    cached: list[int] = []
    for turn in range(4):
        items.append({"role": "user", "content": f"turn {turn}: " + "detail " * 150})
        response = await client.responses.create(model=MODEL, instructions=instructions, input=items, store=False)
        assert response.usage is not None
        cached.append(response.usage.input_tokens_details.cached_tokens)
        items += carried(response)
    assert cached[0] == 0
    assert cached[1] >= 1024
    assert cached == sorted(cached) and cached[3] > cached[1]
    items[0] = {"role": "user", "content": "turn 0: changed"}
    response = await client.responses.create(model=MODEL, instructions=instructions, input=items, store=False)
    assert response.usage is not None
    assert 0 < response.usage.input_tokens_details.cached_tokens < cached[1]


async def test_previous_response_id_continues_a_stored_response(client: AsyncOpenAI, upstream: OpenAIUpstream) -> None:
    upstream.responses_responder = default_responses_responder
    first = await client.responses.create(model=MODEL, input="hello")
    second = await client.responses.create(model=MODEL, input="again", previous_response_id=first.id)
    assert first.output_text == "ok 1 items" and second.output_text == "ok 3 items"
    assert second.previous_response_id == first.id
    assert first.usage is not None and second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    unstored = await client.responses.create(model=MODEL, input="hello", store=False)
    assert await post(upstream, {"model": MODEL, "input": "x", "previous_response_id": unstored.id}) == (
        400,
        invalid(
            f"Previous response with id '{unstored.id}' not found.",
            "previous_response_id",
            "previous_response_not_found",
        ),
    )
    message = second.output[0]
    referenced = await client.responses.create(
        model=MODEL, input=[{"role": "user", "content": "hi"}, {"type": "item_reference", "id": message.id}]
    )
    assert referenced.output_text == "ok 2 items"


async def test_server_side_compaction_emits_a_compaction_item_that_stands_for_what_came_before(
    client: AsyncOpenAI, upstream: OpenAIUpstream
) -> None:
    upstream.responses_responder = default_responses_responder
    items: list[dict[str, Any]] = [{"role": "user", "content": "story " * 600}]
    management: Any = [{"type": "compaction", "compact_threshold": 500}]
    compacted = await client.responses.create(model=MODEL, input=items, store=False, context_management=management)
    compaction = compacted.output[0]
    assert isinstance(compaction, ResponseCompactionItem) and compaction.id.startswith("cmp_")
    assert compacted.output_text == "ok 1 items"  # the model answered from the compaction item alone
    assert compacted.usage is not None and compacted.usage.input_tokens > 600
    follow_up = {"role": "user", "content": "and then?"}
    kept_all = await client.responses.create(model=MODEL, input=[*items, *carried(compacted), follow_up], store=False)
    dropped = await client.responses.create(model=MODEL, input=[*carried(compacted), follow_up], store=False)
    assert kept_all.output_text == dropped.output_text == "ok 3 items"
    assert kept_all.usage is not None and dropped.usage is not None
    assert kept_all.usage.input_tokens == dropped.usage.input_tokens < compacted.usage.input_tokens / 4
    events, streamed_compaction = await streamed(client, model=MODEL, input=items, context_management=management)
    assert streamed_compaction.output[0].type == "compaction"
    assert [e.type for e in events[2:4]] == ["response.output_item.added", "response.output_item.done"]


async def test_the_compact_endpoint_returns_the_user_messages_and_one_compaction_item(
    client: AsyncOpenAI, upstream: OpenAIUpstream
) -> None:
    upstream.responses_responder = responses_tool_loop_responder("search", steps=1, reasoning=False)
    items: list[dict[str, Any]] = [{"role": "user", "content": "find " * 300}]
    first = await client.responses.create(model=MODEL, input=items, store=False)
    items += carried(first) + answers(first)
    second = await client.responses.create(model=MODEL, input=items, store=False)
    items += carried(second)
    window = await client.responses.compact(model=MODEL, input=items)  # type: ignore[arg-type]
    assert window.object == "response.compaction"
    user, compaction = window.output
    assert user.type == "message" and compaction.type == "compaction"
    assert second.usage is not None and window.usage.input_tokens > second.usage.input_tokens
    upstream.responses_responder = default_responses_responder
    follow_up = {"role": "user", "content": "next"}
    # The SDK types the listed user messages as output messages, whose parts it expects to be output_text.
    compacted_window = [item.model_dump(exclude_none=True, warnings=False) for item in window.output]
    resumed = await client.responses.create(model=MODEL, input=[*compacted_window, follow_up], store=False)
    assert resumed.output_text == "ok 3 items"  # the user message before the compaction item stays seen
    assert resumed.usage is not None and resumed.usage.input_tokens < window.usage.input_tokens


async def test_truncation_auto_drops_the_oldest_items_never_a_call_without_its_output() -> None:
    seen: list[list[dict[str, Any]]] = []

    def record(request: dict[str, Any]) -> ResponsesReply:
        seen.append(request["input"])
        return ResponsesReply(text="ok")

    items: list[dict[str, Any]] = []
    for n in range(6):
        items.append({"role": "user", "content": f"ask {n} " + "pad " * 40})
        items.append({"type": "function_call", "call_id": f"call_{n}", "name": "search", "arguments": "{}"})
        items.append({"type": "function_call_output", "call_id": f"call_{n}", "output": "found " * 40})
    async with OpenAIUpstream(context_window=400, responses_responder=record) as upstream:
        body = {"model": MODEL, "input": items}
        assert await post(upstream, body) == (400, invalid(OVERFLOW_MESSAGE, code="context_length_exceeded"))
        status, answer = await post(upstream, {**body, "truncation": "auto"})
        assert status == 200 and answer["truncation"] == "auto"
        assert answer["usage"]["input_tokens"] <= 400
        kept = seen[-1]
        assert kept == items[len(items) - len(kept) :] and 0 < len(kept) < len(items)
        assert kept[0]["type"] != "function_call_output"


async def test_scripted_failures_and_misreports_apply_to_the_responses_route(
    client: AsyncOpenAI, upstream: OpenAIUpstream
) -> None:
    upstream.fail_next(429)
    with pytest.raises(openai.RateLimitError):
        await client.responses.create(model=MODEL, input="hi")
    upstream.misreport_usage_next(input_tokens=10**9)
    response = await client.responses.create(model=MODEL, input="hi")
    assert response.usage is not None and response.usage.input_tokens == 10**9
    response = await client.responses.create(model=MODEL, input="hi")
    assert response.usage is not None and response.usage.input_tokens < 100


async def test_function_calls_the_responder_names_keep_their_call_ids(
    client: AsyncOpenAI, upstream: OpenAIUpstream
) -> None:
    upstream.responses_responder = lambda request: ResponsesReply(
        function_calls=(FunctionCall("search", '{"q": "a"}', "call_a"), FunctionCall("search", '{"q": "b"}'))
    )
    events, response = await streamed(client, model=MODEL, input="go")
    calls = [item for item in response.output if isinstance(item, ResponseFunctionToolCall)]
    assert calls[0].call_id == "call_a" and calls[1].call_id.startswith("call_")
    arguments = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert arguments == ['{"q": "a"}', '{"q": "b"}']


async def test_max_output_tokens_cuts_the_text_and_marks_the_response_incomplete(
    client: AsyncOpenAI, upstream: OpenAIUpstream
) -> None:
    upstream.responses_responder = lambda request: ResponsesReply(text="word " * 100, reasoning=True)
    response = await client.responses.create(model=MODEL, input="talk", max_output_tokens=50)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 50
    events, streamed_response = await streamed_until(client, "response.incomplete", model=MODEL, input="talk")
    assert streamed_response.status == "incomplete" and events[-1].type == "response.incomplete"


async def streamed_until(client: AsyncOpenAI, last: str, **params: Any) -> tuple[list[Any], Response]:
    events = [event async for event in await client.responses.create(stream=True, max_output_tokens=50, **params)]
    assert events[-1].type == last
    return events, events[-1].response


async def test_the_input_tokens_endpoint_counts_what_create_would(
    client: AsyncOpenAI, upstream: OpenAIUpstream
) -> None:
    upstream.responses_responder = default_responses_responder
    params: dict[str, Any] = {"model": MODEL, "instructions": "be brief", "tools": TOOLS, "input": "count me"}
    counted = await client.responses.input_tokens.count(**params)
    response = await client.responses.create(**params)
    assert counted.object == "response.input_tokens"
    assert response.usage is not None and counted.input_tokens == response.usage.input_tokens


def _user(size: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "ask " * size}]


def _call(size: int, interrupted: bool, call_id: str) -> list[dict[str, Any]]:
    """A call and its output, with a user message between them when `interrupted`."""
    arguments = json.dumps({"q": "term " * size})
    call = {"type": "function_call", "call_id": call_id, "name": "search", "arguments": arguments}
    output = {"type": "function_call_output", "call_id": call_id, "output": "found " * size}
    return [call, *(_user(3) if interrupted else []), output]


conversation_items = st.lists(
    st.one_of(
        st.builds(_user, st.integers(1, 60)),
        st.builds(_call, st.integers(1, 60), st.booleans(), st.uuids().map(lambda u: f"call_{u.hex[:12]}")),
    ),
    max_size=12,
).map(lambda groups: [item for group in groups for item in group])


@settings(max_examples=examples(100), deadline=None)
@given(items=conversation_items, share=st.floats(0, 1))
def test_truncation_keeps_the_newest_items_that_fit_never_a_call_without_its_output(
    items: list[dict[str, Any]], share: float
) -> None:
    budget = int(share * len(prompt_sequence("be brief", TOOLS, items, "o200k_base")))
    before = json.dumps(items)
    kept = truncate_to_fit("be brief", TOOLS, items, "o200k_base", budget)
    assert json.dumps(items) == before  # input never mutated
    if kept:  # a tail of the items, less the outputs of the calls dropped before it
        start = next(i for i, item in enumerate(items) if item is kept[0])
        dropped = {item["call_id"] for item in items[:start] if item.get("type") == "function_call"}
        assert kept == [item for item in items[start:] if item.get("call_id") not in dropped]
    check_pairing(kept)
    if kept:
        assert len(prompt_sequence("be brief", TOOLS, kept, "o200k_base")) <= budget
    if len(prompt_sequence("be brief", TOOLS, items, "o200k_base")) <= budget:
        assert kept == items


@pytest.mark.parametrize(
    ("extra", "status", "expected"),
    [
        ({"model": None}, 400, invalid(*type_error("model", "a string", "an object"))),
        ({"model": ""}, 400, invalid("The requested model '' does not exist.", "model", "model_not_found")),
        ({"input": None}, 400, invalid(*type_error("input", "a string", "an object"))),
        ({"zzz_unknown": 1}, 400, invalid("Unknown parameter: 'zzz_unknown'.", "zzz_unknown", "unknown_parameter")),
        ({"stre": 1}, 400, invalid("Unknown parameter: 'stre'. Did you mean 'store' or 'stream'?", "stre", UNKNOWN)),
        ({"strem": 1}, 400, invalid("Unknown parameter: 'strem'. Did you mean 'stream' or 'store'?", "strem", UNKNOWN)),
        ({"modell": 1}, 400, invalid("Unknown parameter: 'modell'.", "modell", UNKNOWN)),
        (
            {"stream_options": {"include_usage": True}},
            400,
            invalid("Unknown parameter: 'stream_options.include_usage'.", "stream_options.include_usage", UNKNOWN),
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}]},
            400,
            invalid(
                "Unsupported parameter: 'messages'. In the Responses API, this parameter has moved to 'input'. "
                "Try again with the new parameter. See the API documentation for more information: "
                "https://platform.openai.com/docs/api-reference/responses/create.",
                None,
                "unsupported_parameter",
            ),
        ),
        (
            {"include": ["bogus.thing"]},
            400,
            invalid(
                "Invalid value: 'bogus.thing'. Supported values are: 'file_search_call.results', "
                "'web_search_call.results', 'web_search_call.action.sources', 'message.input_image.image_url', "
                "'computer_call_output.output.image_url', 'code_interpreter_call.outputs', "
                "'reasoning.encrypted_content', and 'message.output_text.logprobs'.",
                "include[0]",
                "invalid_value",
            ),
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
            400,
            invalid("Missing required parameter: 'tools[0].name'.", "tools[0].name", "missing_required_parameter"),
        ),
        ({"tools": "x"}, 400, invalid(*type_error("tools", "an array of tools", "a string"))),
        ({"store": "x"}, 400, invalid(*type_error("store", "a boolean", "a string"))),
        (
            {"max_output_tokens": 15},
            400,
            invalid(
                "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but got 15 instead.",
                "max_output_tokens",
                "integer_below_min_value",
            ),
        ),
        (
            {"truncation": "bogus"},
            400,
            invalid(
                "Invalid value: 'bogus'. Supported values are: 'auto' and 'disabled'.", "truncation", "invalid_value"
            ),
        ),
        (
            {"input": []},
            400,
            invalid(
                "One of \"input\" or \"previous_response_id\" or 'prompt' or 'conversation' must be provided.",
                None,
                "missing_required_parameter",
            ),
        ),
        (
            {"conversation": "conv_x", "previous_response_id": "resp_x"},
            400,
            invalid(
                "Mutually exclusive parameters: ''. Ensure you are only providing one of: 'pre..._id' or "
                "'conversation'.",
                None,
                "mutually_exclusive_parameters",
            ),
        ),
        ({"conversation": "conv_x"}, 404, invalid("Conversation with id 'conv_x' not found.", None)),
    ],
)
async def test_malformed_requests_are_refused_with_openais_body(
    upstream: OpenAIUpstream, extra: dict[str, Any], status: int, expected: dict[str, Any]
) -> None:
    assert await post(upstream, {"model": MODEL, "input": "hi", **extra}) == (status, expected)


async def test_a_request_without_input_is_refused_before_its_unknown_keys(upstream: OpenAIUpstream) -> None:
    missing = invalid("Missing required parameter: 'input'.", "input", "missing_required_parameter")
    assert await post(upstream, {"model": MODEL, "zzz": 1}) == (400, missing)


async def test_a_conversation_keeps_its_items_across_responses(client: AsyncOpenAI, upstream: OpenAIUpstream) -> None:
    upstream.responses_responder = default_responses_responder
    conversation = await client.conversations.create(items=[{"role": "system", "content": "be brief"}])
    assert conversation.id.startswith("conv_")
    first = await client.responses.create(model=MODEL, input="hello", conversation=conversation.id)
    second = await client.responses.create(model=MODEL, input="again", conversation={"id": conversation.id})
    assert first.output_text == "ok 2 items" and second.output_text == "ok 4 items"
    assert second.conversation is not None and second.conversation.id == conversation.id


async def test_a_scripted_cut_breaks_a_responses_stream_before_its_completion(
    client: AsyncOpenAI, upstream: OpenAIUpstream
) -> None:
    upstream.fail_next(cut_after_chunks=3)
    seen: list[str] = []
    with pytest.raises(openai.APIError):
        async for event in await client.responses.create(model=MODEL, input="hi", stream=True):
            seen.append(event.type)
    assert seen == ["response.created", "response.in_progress", "response.output_item.added"]
    assert upstream.streams_started == 1 and upstream.streams_completed == 0
