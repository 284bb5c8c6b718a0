"""Chat completions (`POST /v1/chat/completions`) as a test's client sends and reads them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.support.reading_model import reading_chat_responder
from tests.support.wire_formats.case import PARAGRAPH, QUESTION, SYSTEM, TOOL, Answer, FormatCase, Upstream, sse_data


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


CHAT_COMPLETIONS: Final = ChatCompletionsCase()
