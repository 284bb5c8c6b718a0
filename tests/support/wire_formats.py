"""One test adapter per wire format, so an end-to-end test is written once and run for every format.

A `FormatCase` knows what a client of its format sends and reads: the path, a conversation request of N turns with
a system prompt and tool calls, the next turn of one, the credentials header, the text and prompt tokens of an answer,
and which fake upstream (`upstream_fixture`) serves the format and records what the proxy forwarded. A test takes the
case as its `wire` parameter (`by_format()`), and a new format inherits the test by adding its case to `CASES`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import aiohttp
import orjson
import pytest

from tests.support.anthropic_upstream import AnthropicUpstream
from tests.support.openai_upstream import OpenAIUpstream
from tests.support.proxies import RunningProxy
from tests.support.reading_model import (
    reading_chat_responder,
    reading_messages_responder,
    reading_responses_responder,
)

Upstream = OpenAIUpstream | AnthropicUpstream
"""A fake upstream serving one of the formats."""

SYSTEM: Final = "You are terse."
PARAGRAPH: Final = "The deploy failed because the migration locked the orders table for eleven minutes. "
"""About 16 tokens: a turn of `conversation(turns, paragraphs)` holds three times `paragraphs` of them."""
QUESTION: Final = "What went wrong, in one line?"
TOOL: Final = "lookup"


@dataclass(frozen=True)
class Answer:
    """What an answer gave the client: its text, the tools it calls, its prompt tokens (None if not reported), and
    the kinds of its parts in the format's words (`FormatCase.text_part` for each text)."""

    text: str
    calls: list[str]
    prompt_tokens: int | None
    parts: list[str]


def sse_data(raw: bytes) -> list[dict[str, Any]]:
    """The JSON `data` of each event of a server-sent event stream (`[DONE]` left out)."""
    lines = (line for frame in raw.split(b"\n\n") for line in frame.split(b"\n"))
    return [orjson.loads(line[6:]) for line in lines if line.startswith(b"data: ") and line != b"data: [DONE]"]


class FormatCase:
    """What an end-to-end test needs to know of one wire format (see the module docstring)."""

    name: str = ""
    """The format's name, as the proxy's metrics label it (`api`) and as the test's id."""
    path: str = ""
    model: str = ""
    upstream_fixture: str = ""
    """The conftest fixture that starts this format's fake upstream."""
    entries: str = ""
    """The body's key that holds the conversation."""
    text_part: str = ""
    """What the format calls the part of an answer that holds its text (see `Answer.parts`)."""
    no_tools: ClassVar[Any] = "none"
    """The `tool_choice` that lets the model call no tool."""
    moving_breakpoints: bool = False
    """Whether the client marks cache breakpoints in the body and moves them as the conversation grows (Anthropic's
    `cache_control`): a call that repeats a forwarded request's entries then repeats them, not their bytes."""
    overflow_states_window: bool = True
    """Whether the upstream's overflow error says how large the window is (the Responses API's does not: the proxy
    learns an estimate from it)."""

    def __repr__(self) -> str:
        return self.name

    def credentials(self, key: str) -> dict[str, str]:
        """The headers a client of this format sends its API key in (and whatever else the API requires)."""
        return {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def conversation(self, turns: int, paragraphs: int = 8, model: str = "", tools: bool = True) -> dict[str, Any]:
        """A request: a system prompt, `turns` turns and a last question.

        A turn is a question, a call of the `lookup` tool, its result and an answer, each `paragraphs` long (about 16
        tokens each); without `tools`, a question and an answer only, and no tool offered.
        """
        raise NotImplementedError

    def tool_conversation(self, task: str, results: Sequence[tuple[str, str]], question: str) -> dict[str, Any]:
        """A request: a system prompt, the `task`, one call of each tool named in `results` answered with its text
        (in order), and the `question`; the request offers those tools."""
        raise NotImplementedError

    def next_turn(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The conversation's next request: the model's short answer and one more question appended."""
        raise NotImplementedError

    def use_reading_model(self, upstream: Upstream) -> None:
        """Make the upstream's model of this format read offloaded results back (`tests.support.reading_model`)."""
        raise NotImplementedError

    def reply_text(self, answer: Mapping[str, Any]) -> str:
        """The text of a JSON answer."""
        return self.read(answer).text

    def read(self, answer: Mapping[str, Any] | bytes) -> Answer:
        """What a JSON answer, or a streamed one (its bytes), gave the client."""
        raise NotImplementedError

    def read_result(self, text: str) -> dict[str, Any]:
        """The entry the proxy appends with the text its read tool's first call (by the reading model) returned."""
        raise NotImplementedError

    def tool_names(self, raw: bytes) -> list[str]:
        """The names of the tools a forwarded body offers."""
        return [tool.get("name") or tool["function"]["name"] for tool in orjson.loads(raw).get("tools") or ()]

    def prompt_tokens(self, answer: Mapping[str, Any]) -> int:
        """The prompt tokens a JSON answer reports (cached or not)."""
        raise NotImplementedError

    def forwarded(self, upstream: Upstream) -> list[bytes]:
        """The bodies of this format's requests the upstream received, byte for byte, in order (rejected ones too)."""
        raise NotImplementedError

    def streamed(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """`body` asked to be streamed, with its usage."""
        return {**body, "stream": True}

    def upstream_prompt_tokens(self, upstream: Upstream) -> list[int]:
        """The prompt tokens of each request of this format the upstream answered."""
        raise NotImplementedError

    def forwarded_headers(self, upstream: Upstream) -> list[dict[str, str]]:
        """The headers of each request of this format the upstream received, names in lower case."""
        raise NotImplementedError

    def url(self, proxy: RunningProxy) -> str:
        """Where a client of this format posts through `proxy`."""
        return f"http://127.0.0.1:{proxy.server.port}{self.path}"

    async def post(
        self, proxy: RunningProxy, body: Mapping[str, Any] | bytes, key: str = "sk-alice", **headers: str
    ) -> tuple[int, dict[str, str], Any]:
        """POST `body` (bytes as they are) through `proxy` with plain aiohttp: the status, headers and parsed answer.

        A streamed answer is read whole and returned as its bytes.
        """
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with (
            aiohttp.ClientSession() as http,
            http.post(self.url(proxy), data=data, headers={**self.credentials(key), **headers}) as response,
        ):
            raw = await response.read()
            streamed = response.content_type == "text/event-stream"
            return response.status, dict(response.headers), raw if streamed else json.loads(raw)


class ChatCompletionsCase(FormatCase):
    name = "chat_completions"
    path = "/v1/chat/completions"
    model = "gpt-4o-mini"
    upstream_fixture = "openai_upstream"
    entries = "messages"
    text_part = "content"

    def conversation(self, turns: int, paragraphs: int = 8, model: str = "", tools: bool = True) -> dict[str, Any]:
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        for turn in range(turns):
            call = {"id": f"call_{turn}", "type": "function", "function": {"name": TOOL, "arguments": "{}"}}
            messages.append({"role": "user", "content": f"Question {turn}: " + PARAGRAPH * paragraphs})
            if tools:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": PARAGRAPH * paragraphs})
            messages.append({"role": "assistant", "content": PARAGRAPH * paragraphs})
        messages.append({"role": "user", "content": QUESTION})
        schemas = [{"type": "function", "function": {"name": TOOL, "parameters": {"type": "object", "properties": {}}}}]
        return {"model": model or self.model, "messages": messages, **({"tools": schemas} if tools else {})}

    def tool_conversation(self, task: str, results: Sequence[tuple[str, str]], question: str) -> dict[str, Any]:
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
        for number, (name, result) in enumerate(results, 1):
            call = {"id": f"call_{number}", "type": "function", "function": {"name": name, "arguments": "{}"}}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": f"call_{number}", "content": result})
        messages.append({"role": "user", "content": question})
        schema = {"type": "object", "properties": {}}
        tools = [{"type": "function", "function": {"name": name, "parameters": schema}} for name, _ in results]
        return {"model": self.model, "messages": messages, "tools": tools}

    def next_turn(self, body: Mapping[str, Any]) -> dict[str, Any]:
        added = [{"role": "assistant", "content": "A lock."}, {"role": "user", "content": "And then?"}]
        return {**body, "messages": [*body["messages"], *added]}

    def use_reading_model(self, upstream: Upstream) -> None:
        assert isinstance(upstream, OpenAIUpstream)
        upstream.responder = reading_chat_responder

    def read_result(self, text: str) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": "read-0", "content": text}

    def read(self, answer: Mapping[str, Any] | bytes) -> Answer:
        if not isinstance(answer, bytes):
            message = answer["choices"][0]["message"]
            calls = [call["function"]["name"] for call in message.get("tool_calls") or ()]
            text = message.get("content") or ""
            return Answer(text, calls, answer["usage"]["prompt_tokens"], self._parts(text, calls))
        chunks = sse_data(answer)
        deltas = [choice["delta"] for chunk in chunks for choice in chunk["choices"]]
        names = [call["function"].get("name") for delta in deltas for call in delta.get("tool_calls") or ()]
        usages = [chunk["usage"]["prompt_tokens"] for chunk in chunks if chunk.get("usage")]
        text = "".join(delta.get("content") or "" for delta in deltas)
        calls = [name for name in names if name]
        return Answer(text, calls, usages[-1] if usages else None, self._parts(text, calls))

    def _parts(self, text: str, calls: list[str]) -> list[str]:
        return ([self.text_part] if text else []) + ["tool_calls"] * bool(calls)

    def prompt_tokens(self, answer: Mapping[str, Any]) -> int:
        return int(answer["usage"]["prompt_tokens"])

    def streamed(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return {**body, "stream": True, "stream_options": {"include_usage": True}}

    def forwarded(self, upstream: Upstream) -> list[bytes]:
        assert isinstance(upstream, OpenAIUpstream)
        return [request.body for request in upstream.requests if request.path.endswith("/chat/completions")]

    def forwarded_headers(self, upstream: Upstream) -> list[dict[str, str]]:
        assert isinstance(upstream, OpenAIUpstream)
        chat = (request for request in upstream.requests if request.path.endswith("/chat/completions"))
        return [{name.lower(): value for name, value in request.headers.items()} for request in chat]

    def upstream_prompt_tokens(self, upstream: Upstream) -> list[int]:
        assert isinstance(upstream, OpenAIUpstream)
        return [usage["prompt_tokens"] for usage in upstream.usages]


class ResponsesCase(FormatCase):
    name = "responses"
    path = "/v1/responses"
    model = "gpt-4.1"
    upstream_fixture = "openai_upstream"
    entries = "input"
    text_part = "message"
    overflow_states_window = False

    def conversation(self, turns: int, paragraphs: int = 8, model: str = "", tools: bool = True) -> dict[str, Any]:
        items: list[dict[str, Any]] = []
        for turn in range(turns):
            items.append({"role": "user", "content": f"Question {turn}: " + PARAGRAPH * paragraphs})
            if tools:
                items.append({"type": "function_call", "call_id": f"call_{turn}", "name": TOOL, "arguments": "{}"})
                output = PARAGRAPH * paragraphs
                items.append({"type": "function_call_output", "call_id": f"call_{turn}", "output": output})
            items.append({"role": "assistant", "content": PARAGRAPH * paragraphs})
        items.append({"role": "user", "content": QUESTION})
        schemas = [{"type": "function", "name": TOOL, "parameters": {"type": "object", "properties": {}}}]
        offered = {"tools": schemas} if tools else {}
        return {"model": model or self.model, "instructions": SYSTEM, "input": items, **offered, "store": False}

    def tool_conversation(self, task: str, results: Sequence[tuple[str, str]], question: str) -> dict[str, Any]:
        items: list[dict[str, Any]] = [{"role": "user", "content": task}]
        for number, (name, result) in enumerate(results, 1):
            items.append({"type": "function_call", "call_id": f"call_{number}", "name": name, "arguments": "{}"})
            items.append({"type": "function_call_output", "call_id": f"call_{number}", "output": result})
        items.append({"role": "user", "content": question})
        schema = {"type": "object", "properties": {}}
        tools = [{"type": "function", "name": name, "parameters": schema} for name, _ in results]
        return {"model": self.model, "instructions": SYSTEM, "input": items, "tools": tools}

    def next_turn(self, body: Mapping[str, Any]) -> dict[str, Any]:
        added = [{"role": "assistant", "content": "A lock."}, {"role": "user", "content": "And then?"}]
        return {**body, "input": [*body["input"], *added]}

    def use_reading_model(self, upstream: Upstream) -> None:
        assert isinstance(upstream, OpenAIUpstream)
        upstream.responses_responder = reading_responses_responder

    def read_result(self, text: str) -> dict[str, Any]:
        return {"type": "function_call_output", "call_id": "read-0", "output": text}

    def read(self, answer: Mapping[str, Any] | bytes) -> Answer:
        if isinstance(answer, bytes):
            events = sse_data(answer)
            (answer,) = [event["response"] for event in events if event["type"] == "response.completed"]
            added = [event["item"] for event in events if event["type"] == "response.output_item.added"]
            assert [item["type"] for item in added] == [item["type"] for item in answer["output"]], "hidden items"
        messages = [item for item in answer["output"] if item["type"] == "message"]
        text = "".join(part.get("text", "") for item in messages for part in item["content"])
        calls = [item["name"] for item in answer["output"] if item["type"] == "function_call"]
        parts = [item["type"] for item in answer["output"]]
        return Answer(text, calls, answer["usage"]["input_tokens"], parts)

    def prompt_tokens(self, answer: Mapping[str, Any]) -> int:
        return int(answer["usage"]["input_tokens"])

    def forwarded(self, upstream: Upstream) -> list[bytes]:
        assert isinstance(upstream, OpenAIUpstream)
        return [request.body for request in upstream.requests if request.path == "/v1/responses"]

    def forwarded_headers(self, upstream: Upstream) -> list[dict[str, str]]:
        assert isinstance(upstream, OpenAIUpstream)
        responses = (request for request in upstream.requests if request.path == "/v1/responses")
        return [{name.lower(): value for name, value in request.headers.items()} for request in responses]

    def upstream_prompt_tokens(self, upstream: Upstream) -> list[int]:
        assert isinstance(upstream, OpenAIUpstream)
        return [usage["input_tokens"] for usage in upstream.responses_usages]


class MessagesCase(FormatCase):
    name = "messages"
    path = "/v1/messages"
    model = "claude-sonnet-4-5"
    upstream_fixture = "anthropic_upstream"
    entries = "messages"
    text_part = "text"
    no_tools: ClassVar[Any] = {"type": "none"}
    moving_breakpoints = True

    def credentials(self, key: str) -> dict[str, str]:
        return {"x-api-key": key, "anthropic-version": "2023-06-01", "content-type": "application/json"}

    def conversation(self, turns: int, paragraphs: int = 8, model: str = "", tools: bool = True) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        for turn in range(turns):
            call = {"type": "tool_use", "id": f"toolu_{turn:04d}", "name": TOOL, "input": {}}
            result = {"type": "tool_result", "tool_use_id": f"toolu_{turn:04d}", "content": PARAGRAPH * paragraphs}
            messages.append({"role": "user", "content": f"Question {turn}: " + PARAGRAPH * paragraphs})
            if tools:
                messages += [{"role": "assistant", "content": [call]}, {"role": "user", "content": [result]}]
            messages.append({"role": "assistant", "content": PARAGRAPH * paragraphs})
        messages.append({"role": "user", "content": QUESTION})
        schemas = [{"name": TOOL, "description": "Look it up.", "input_schema": {"type": "object", "properties": {}}}]
        return {
            "model": model or self.model,
            "max_tokens": 512,
            "system": SYSTEM,
            "tools": schemas,
            "messages": messages,
        }

    def tool_conversation(self, task: str, results: Sequence[tuple[str, str]], question: str) -> dict[str, Any]:
        messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
        for number, (name, result) in enumerate(results, 1):
            call = {"type": "tool_use", "id": f"toolu_{number}", "name": name, "input": {}}
            messages.append({"role": "assistant", "content": [call]})
            answered = {"type": "tool_result", "tool_use_id": f"toolu_{number}", "content": result}
            messages.append({"role": "user", "content": [answered]})
        messages += [{"role": "assistant", "content": "Noted."}, {"role": "user", "content": question}]
        schema = {"type": "object", "properties": {}}
        tools = [{"name": name, "description": name, "input_schema": schema} for name, _ in results]
        return {"model": self.model, "max_tokens": 500, "system": SYSTEM, "tools": tools, "messages": messages}

    def next_turn(self, body: Mapping[str, Any]) -> dict[str, Any]:
        added = [{"role": "assistant", "content": "A lock."}, {"role": "user", "content": "And then?"}]
        return {**body, "messages": [*body["messages"], *added]}

    def use_reading_model(self, upstream: Upstream) -> None:
        assert isinstance(upstream, AnthropicUpstream)
        upstream.responder = reading_messages_responder

    def read_result(self, text: str) -> dict[str, Any]:
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_read0", "content": text}]}

    def read(self, answer: Mapping[str, Any] | bytes) -> Answer:
        if isinstance(answer, bytes):
            events = sse_data(answer)
            assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
            blocks = [event["content_block"] for event in events if event["type"] == "content_block_start"]
            deltas = [event["delta"] for event in events if event["type"] == "content_block_delta"]
            text = "".join(delta.get("text", "") for delta in deltas)
            (usage,) = [event["usage"] for event in events if event["type"] == "message_delta"]
        else:
            blocks, usage = answer["content"], answer["usage"]
            text = "".join(block["text"] for block in blocks if block["type"] == "text")
        calls = [block["name"] for block in blocks if block["type"] == "tool_use"]
        parts = [block["type"] for block in blocks]
        return Answer(text, calls, self.prompt_tokens({"usage": usage}), parts)

    def prompt_tokens(self, answer: Mapping[str, Any]) -> int:
        usage = answer["usage"]
        return int(usage["input_tokens"] + usage["cache_creation_input_tokens"] + usage["cache_read_input_tokens"])

    def forwarded(self, upstream: Upstream) -> list[bytes]:
        assert isinstance(upstream, AnthropicUpstream)
        return list(upstream.bodies)

    def forwarded_headers(self, upstream: Upstream) -> list[dict[str, str]]:
        assert isinstance(upstream, AnthropicUpstream)
        return list(upstream.headers)

    def upstream_prompt_tokens(self, upstream: Upstream) -> list[int]:
        assert isinstance(upstream, AnthropicUpstream)
        return [self.prompt_tokens({"usage": usage}) for usage in upstream.usages]


CHAT_COMPLETIONS: Final = ChatCompletionsCase()
RESPONSES: Final = ResponsesCase()
MESSAGES: Final = MessagesCase()
CASES: Final[tuple[FormatCase, ...]] = (CHAT_COMPLETIONS, RESPONSES, MESSAGES)
"""Every format the end-to-end tests run for; a new format's case added here inherits them."""


def by_format(*cases: FormatCase, xfail: Mapping[FormatCase, str] | None = None) -> pytest.MarkDecorator:
    """Parametrize a test's `wire` over `cases` (all of `CASES` if none), with a strict xfail for each format in
    `xfail` (the reason: what the proxy cannot yet do for it)."""
    failing = xfail or {}
    params = [
        pytest.param(case, id=case.name, marks=[pytest.mark.xfail(strict=True, reason=failing[case])])
        if case in failing
        else pytest.param(case, id=case.name)
        for case in cases or CASES
    ]
    return pytest.mark.parametrize("wire", params)
