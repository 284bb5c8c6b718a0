"""The Responses API (`POST /v1/responses`) as a test's client sends and reads it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.support.reading_model import reading_responses_responder
from tests.support.wire_formats.case import PARAGRAPH, QUESTION, SYSTEM, TOOL, Answer, FormatCase, Upstream, sse_data


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
        response = answer
        if isinstance(answer, bytes):
            # The response `response.completed` carries, and no item the stream showed that it does not hold.
            events = sse_data(answer)
            (response,) = [event["response"] for event in events if event["type"] == "response.completed"]
            added = [event["item"] for event in events if event["type"] == "response.output_item.added"]
            assert [item["type"] for item in added] == [item["type"] for item in response["output"]], "hidden items"
        assert not isinstance(response, bytes)
        output = response["output"]
        messages = [item for item in output if item["type"] == "message"]
        text = "".join(part.get("text", "") for item in messages for part in item["content"])
        calls = [item["name"] for item in output if item["type"] == "function_call"]
        return Answer(text, calls, response["usage"]["input_tokens"], [item["type"] for item in output])

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


RESPONSES: Final = ResponsesCase()
