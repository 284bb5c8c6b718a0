"""The demo agent's side of each wire format: the request it sends, what it reads back, and the tool results.

A `Conversation` holds the whole history client-side, as SDK users keep it, and grows it turn by turn: the model's
answer, then a result for each tool call it made (a file of the simulated repository, a few hundred tokens), or,
when the model answered in text, the next user task. `direct_tokens` is what the model would count for the request
as the client built it: what going direct would send.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from proxy.simulator.anthropic_rules import prompt_segments
from proxy.simulator.openai_tokens import count_prompt_tokens, encoding_name_for_model
from proxy.simulator.responses_items import normalize_input
from proxy.simulator.responses_tokens import prompt_sequence, visible_items

SYSTEM: Final = "You are a careful code reviewer. Read the files you need with read_file, then report."
TOOL_NAME: Final = "read_file"
TOOL_DESCRIPTION: Final = "Read one file of the repository."
TOOL_PARAMETERS: Final = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
FILE_FUNCTIONS: Final = 24
"""Functions in each file read: about 500 tokens."""


def task(number: int) -> str:
    """The user's message opening task `number`."""
    return f"Task {number}: review the handlers in package {number} and report what each one retries."


def path_of(arguments: object) -> str:
    """The `path` a call names: its arguments as an object, or the JSON text of one."""
    parsed = arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
    path = parsed.get("path") if isinstance(parsed, dict) else None
    return str(path) if path is not None else "README"


def file_text(path: str) -> str:
    """The text of a file of the simulated repository: deterministic in `path`, about 500 tokens."""
    functions = (
        f"def handler_{index}(event, context):\n    return process(event['records'][{index}], retries={index % 5})\n"
        for index in range(FILE_FUNCTIONS)
    )
    return f"# {path}\n" + "".join(functions)


@dataclass(frozen=True)
class Answer:
    """What one answer through the proxy says: the model's prompt as counted, the cached part, whether it is done."""

    prompt_tokens: int
    cached_tokens: int


@dataclass
class Conversation:
    """One format's agent conversation (see the module docstring); a subclass speaks the format."""

    model: str
    path: str
    tasks: int = 0
    entries: list[dict[str, Any]] = field(default_factory=list)

    def next_task(self) -> None:
        """Append the next user task."""
        self.tasks += 1
        self.entries.append(self.user_message(task(self.tasks)))

    def user_message(self, text: str) -> dict[str, Any]:
        """A user message of the format."""
        return {"role": "user", "content": text}

    def body(self) -> dict[str, Any]:
        """The request for the next turn: the whole history."""
        raise NotImplementedError

    def headers(self) -> dict[str, str]:
        """The headers the format's API is called with."""
        return {"Authorization": "Bearer sk-demo"}

    def absorb(self, answer: Mapping[str, Any]) -> Answer:
        """Add the model's answer and the tool results (or the next task) to the history; read its usage."""
        raise NotImplementedError

    def direct_tokens(self, body: Mapping[str, Any]) -> int:
        """The tokens the model counts for `body` as the client built it."""
        raise NotImplementedError


class ChatConversation(Conversation):
    """OpenAI's chat completions: `messages`, function tools, `tool` messages answering calls."""

    def body(self) -> dict[str, Any]:
        """`messages` after the system message, and the read tool."""
        tool = {"name": TOOL_NAME, "description": TOOL_DESCRIPTION, "parameters": TOOL_PARAMETERS}
        messages = [{"role": "system", "content": SYSTEM}, *self.entries]
        return {"model": self.model, "messages": messages, "tools": [{"type": "function", "function": tool}]}

    def absorb(self, answer: Mapping[str, Any]) -> Answer:
        """Keep the assistant message; answer each call with the file it names."""
        message = answer["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        kept = {"role": "assistant", "content": message.get("content")}
        self.entries.append({**kept, "tool_calls": calls} if calls else kept)
        for call in calls:
            text = file_text(path_of(call["function"]["arguments"]))
            self.entries.append({"role": "tool", "tool_call_id": call["id"], "content": text})
        if not calls:
            self.next_task()
        usage = answer["usage"]
        return Answer(usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"])

    def direct_tokens(self, body: Mapping[str, Any]) -> int:
        """OpenAI's count of the messages and tools."""
        return count_prompt_tokens(body)


class ResponsesConversation(Conversation):
    """OpenAI's Responses API, the client keeping the items (`store: false`): function calls and their outputs."""

    def body(self) -> dict[str, Any]:
        """`instructions`, every item so far, and the read tool."""
        tool = {"type": "function", "name": TOOL_NAME, "description": TOOL_DESCRIPTION, "parameters": TOOL_PARAMETERS}
        return {"model": self.model, "instructions": SYSTEM, "input": self.entries, "tools": [tool], "store": False}

    def absorb(self, answer: Mapping[str, Any]) -> Answer:
        """Keep the output items; answer each function call with the file it names."""
        output = list(answer["output"])
        self.entries.extend(output)
        calls = [item for item in output if item.get("type") == "function_call"]
        for call in calls:
            text = file_text(path_of(call["arguments"]))
            self.entries.append({"type": "function_call_output", "call_id": call["call_id"], "output": text})
        if not calls:
            self.next_task()
        usage = answer["usage"]
        return Answer(usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"])

    def direct_tokens(self, body: Mapping[str, Any]) -> int:
        """OpenAI's count of the instructions, tools and items."""
        encoding = encoding_name_for_model(str(body["model"]))
        items = visible_items(normalize_input(body["input"]))
        return len(prompt_sequence(body.get("instructions"), body["tools"], items, encoding))


class MessagesConversation(Conversation):
    """Anthropic's Messages API: `tool_use` blocks answered by `tool_result` blocks, one cache breakpoint at the end."""

    def body(self) -> dict[str, Any]:
        """The messages, the latest one's last block marked for the prompt cache, as agents mark it."""
        messages = [dict(message) for message in self.entries]
        last = messages[-1]
        blocks = last["content"] if isinstance(last["content"], list) else [{"type": "text", "text": last["content"]}]
        last["content"] = [*blocks[:-1], {**blocks[-1], "cache_control": {"type": "ephemeral"}}]
        tool = {"name": TOOL_NAME, "description": TOOL_DESCRIPTION, "input_schema": TOOL_PARAMETERS}
        return {"model": self.model, "max_tokens": 1024, "system": SYSTEM, "messages": messages, "tools": [tool]}

    def headers(self) -> dict[str, str]:
        """The Messages API's key and version headers."""
        return {"x-api-key": "sk-ant-demo", "anthropic-version": "2023-06-01"}

    def absorb(self, answer: Mapping[str, Any]) -> Answer:
        """Keep the content; answer every `tool_use` block in one user message of `tool_result` blocks."""
        content = list(answer["content"])
        self.entries.append({"role": "assistant", "content": content})
        calls = [block for block in content if block.get("type") == "tool_use"]
        results = [
            {"type": "tool_result", "tool_use_id": call["id"], "content": file_text(path_of(call["input"]))}
            for call in calls
        ]
        if results:
            self.entries.append({"role": "user", "content": results})
        else:
            self.next_task()
        usage = answer["usage"]
        read = usage.get("cache_read_input_tokens") or 0
        return Answer(usage["input_tokens"] + (usage.get("cache_creation_input_tokens") or 0) + read, read)

    def direct_tokens(self, body: Mapping[str, Any]) -> int:
        """Anthropic's count of the system prompt, tools and messages."""
        return sum(segment.tokens for segment in prompt_segments(body, body["messages"]))


FORMATS: Final = {
    "chat": (ChatConversation, "gpt-4.1-mini", "/v1/chat/completions"),
    "responses": (ResponsesConversation, "gpt-4.1-mini", "/v1/responses"),
    "messages": (MessagesConversation, "claude-sonnet-4-5", "/v1/messages"),
}
"""Each `--format`: its conversation, the model the demo names, the path it posts to."""


def conversation(wire_format: str) -> Conversation:
    """A fresh conversation of `wire_format`, its first task asked."""
    kind, model, path = FORMATS[wire_format]
    started = kind(model=model, path=path)
    started.next_task()
    return started
