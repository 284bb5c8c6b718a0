"""The Anthropic Messages API (`POST /v1/messages`) as a test's client sends and reads it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final

from proxy.formats.anthropic.rules import without_cache_control
from proxy.simulator.anthropic_rules import blocks_of
from proxy.simulator.anthropic_upstream import AnthropicUpstream
from tests.support.reading_model import reading_messages_responder
from tests.support.wire_formats.case import PARAGRAPH, QUESTION, SYSTEM, TOOL, Answer, FormatCase, Upstream, sse_data


class MessagesCase(FormatCase):
    name = "messages"
    path = "/v1/messages"
    model = "claude-sonnet-4-5"
    upstream_fixture = "anthropic_upstream"
    entries = "messages"
    text_part = "text"
    no_tools: ClassVar[Any] = {"type": "none"}
    moving_breakpoints = True

    def comparable_entries(self, entries: Sequence[Any]) -> list[Any]:
        """Messages with their content as blocks and no breakpoints: a breakpoint the proxy or client adds turns a
        string into a text block and marks it, and neither changes what the model reads or the cache serves."""
        return [{**message, "content": without_cache_control(blocks_of(message))} for message in entries]

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


MESSAGES: Final = MessagesCase()
