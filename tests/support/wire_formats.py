"""One test adapter per wire format, so an end-to-end test is written once and run for every format.

A `FormatCase` knows what a client of its format sends and reads: the path, a conversation request of N turns with
a system prompt and tool calls, the next turn of one, the credentials header, the text and prompt tokens of an answer,
and which fake upstream (`upstream_fixture`) serves the format and records what the proxy forwarded. A test takes the
case as its `wire` parameter (`by_format()`), and a new format inherits the test by adding its case to `CASES`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import aiohttp
import pytest

from tests.support.anthropic_upstream import AnthropicUpstream
from tests.support.openai_upstream import OpenAIUpstream
from tests.support.proxies import RunningProxy

Upstream = OpenAIUpstream | AnthropicUpstream
"""A fake upstream serving one of the formats."""

SYSTEM: Final = "You are terse."
PARAGRAPH: Final = "The deploy failed because the migration locked the orders table for eleven minutes. "
"""About 16 tokens: a turn of `conversation(turns, paragraphs)` holds three times `paragraphs` of them."""
QUESTION: Final = "What went wrong, in one line?"
TOOL: Final = "lookup"


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
        tokens each); without `tools`, a question and an answer only (nothing for tool-result strategies to take).
        """
        raise NotImplementedError

    def next_turn(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The conversation's next request: the model's short answer and one more question appended."""
        raise NotImplementedError

    def reply_text(self, answer: Mapping[str, Any]) -> str:
        """The text of a JSON answer."""
        raise NotImplementedError

    def prompt_tokens(self, answer: Mapping[str, Any]) -> int:
        """The prompt tokens a JSON answer reports (cached or not)."""
        raise NotImplementedError

    def forwarded(self, upstream: Upstream) -> list[bytes]:
        """The bodies of this format's requests the upstream received, byte for byte, in order (rejected ones too)."""
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
        return {"model": model or self.model, "messages": messages, "tools": schemas}

    def next_turn(self, body: Mapping[str, Any]) -> dict[str, Any]:
        added = [{"role": "assistant", "content": "A lock."}, {"role": "user", "content": "And then?"}]
        return {**body, "messages": [*body["messages"], *added]}

    def reply_text(self, answer: Mapping[str, Any]) -> str:
        return str(answer["choices"][0]["message"]["content"])

    def prompt_tokens(self, answer: Mapping[str, Any]) -> int:
        return int(answer["usage"]["prompt_tokens"])

    def forwarded(self, upstream: Upstream) -> list[bytes]:
        assert isinstance(upstream, OpenAIUpstream)
        return [request.body for request in upstream.requests if request.path.endswith("/chat/completions")]


class ResponsesCase(FormatCase):
    name = "responses"
    path = "/v1/responses"
    model = "gpt-4.1"
    upstream_fixture = "openai_upstream"
    entries = "input"
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
        return {"model": model or self.model, "instructions": SYSTEM, "input": items, "tools": schemas, "store": False}

    def next_turn(self, body: Mapping[str, Any]) -> dict[str, Any]:
        added = [{"role": "assistant", "content": "A lock."}, {"role": "user", "content": "And then?"}]
        return {**body, "input": [*body["input"], *added]}

    def reply_text(self, answer: Mapping[str, Any]) -> str:
        messages = [item for item in answer["output"] if item["type"] == "message"]
        return "".join(part.get("text", "") for item in messages for part in item["content"])

    def prompt_tokens(self, answer: Mapping[str, Any]) -> int:
        return int(answer["usage"]["input_tokens"])

    def forwarded(self, upstream: Upstream) -> list[bytes]:
        assert isinstance(upstream, OpenAIUpstream)
        return [request.body for request in upstream.requests if request.path == "/v1/responses"]


class MessagesCase(FormatCase):
    name = "messages"
    path = "/v1/messages"
    model = "claude-sonnet-4-5"
    upstream_fixture = "anthropic_upstream"
    entries = "messages"

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

    def next_turn(self, body: Mapping[str, Any]) -> dict[str, Any]:
        added = [{"role": "assistant", "content": "A lock."}, {"role": "user", "content": "And then?"}]
        return {**body, "messages": [*body["messages"], *added]}

    def reply_text(self, answer: Mapping[str, Any]) -> str:
        return "".join(block["text"] for block in answer["content"] if block["type"] == "text")

    def prompt_tokens(self, answer: Mapping[str, Any]) -> int:
        usage = answer["usage"]
        return int(usage["input_tokens"] + usage["cache_creation_input_tokens"] + usage["cache_read_input_tokens"])

    def forwarded(self, upstream: Upstream) -> list[bytes]:
        assert isinstance(upstream, AnthropicUpstream)
        return list(upstream.bodies)


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
