"""A generated conversation in each wire format: the client's requests, the scripted model, the usage billed.

The client of `bench.recall` keeps the whole conversation and sends all of it before each assistant message of the
script (`Conversation.calls`), as agents do; the fake upstream's model answers with that assistant message. The model
finds its place from what the request ends with, which compaction never changes: the latest user message (always
kept) or the newest tool result's call id. Usage is read back in chat-completion terms (`prompt_tokens`, its
`cached_tokens`, `completion_tokens`), as `bench.billing` adds it up; every fake upstream reports its cache hits
(OpenAI's by the longest cached prefix; Anthropic's at the client's `cache_control` breakpoint, which this client puts
on its newest block each turn, as Claude Code does).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from bench.recall_conversations import Conversation
from proxy.simulator.anthropic_upstream import AnthropicUpstream
from proxy.simulator.openai_upstream import OpenAIUpstream, Reply, ToolCall
from proxy.simulator.responses_api import FunctionCall, ResponsesReply
from tests.support.wire_formats import CHAT_COMPLETIONS, MESSAGES, RESPONSES, FormatCase, Upstream

MAX_OUTPUT: Final = 2048
"""The tokens every request reserves for its reply (`max_tokens` and its kin)."""
REPORT: Final = "Here is the final report."
"""What the model answers the last request with."""

Script = dict[tuple[str, str], dict[str, Any]]
"""The scripted model: (`tool`, call id) or (`user`, text) of what a request ends with -> the assistant message."""


def script(conversation: Conversation) -> Script:
    """What the model answers at each of the conversation's calls, by what the request ends with."""
    answers: Script = {}
    messages = conversation.messages
    for index in conversation.calls():
        last = messages[index - 1]
        key = ("tool", str(last["tool_call_id"])) if last["role"] == "tool" else ("user", str(last["content"]))
        answers[key] = messages[index] if index < len(messages) else {"role": "assistant", "content": REPORT}
    return answers


def _text(content: Any) -> str:
    """The text of a content (a string, or parts holding `text`)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def _calls(message: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """An assistant message's tool calls: (id, name, arguments JSON)."""
    return [
        (call["id"], call["function"]["name"], call["function"]["arguments"])
        for call in message.get("tool_calls") or ()
    ]


@dataclass(frozen=True)
class Wire:
    """One wire format as the benchmark's client and model use it.

    :param case: The test suite's adapter of the format (path, model, credentials, what the upstream recorded).
    :param body: The request a client sends holding the conversation's first `n` messages.
    :param install: Puts the scripted model on the format's fake upstream.
    :param usages: What the upstream billed, request by request, in chat-completion terms.
    """

    case: FormatCase
    body: Callable[[Conversation, int], dict[str, Any]]
    install: Callable[[Upstream, Script], None]
    usages: Callable[[Upstream], list[dict[str, Any]]]

    @property
    def name(self) -> str:
        """The format's name."""
        return self.case.name

    def upstream(self, window: int) -> Upstream:
        """A fresh fake upstream of this format whose models have `window` tokens."""
        if self.case is MESSAGES:
            return AnthropicUpstream(context_window=window)
        return OpenAIUpstream(context_window=window)


# Chat completions ---------------------------------------------------------------------------------------------------


def _chat_body(conversation: Conversation, n: int) -> dict[str, Any]:
    return {
        "model": CHAT_COMPLETIONS.model,
        "max_completion_tokens": MAX_OUTPUT,
        "tools": [{"type": "function", "function": tool} for tool in conversation.tools],
        "messages": conversation.messages[:n],
    }


def _chat_install(upstream: Upstream, answers: Script) -> None:
    assert isinstance(upstream, OpenAIUpstream)

    def respond(request: dict[str, Any]) -> Reply:
        last = request["messages"][-1]
        key = ("tool", str(last["tool_call_id"])) if last["role"] == "tool" else ("user", _text(last["content"]))
        message = answers[key]
        calls = tuple(ToolCall(id, name, arguments) for id, name, arguments in _calls(message))
        return Reply(content=message.get("content"), tool_calls=calls)

    upstream.responder = respond


def _chat_usages(upstream: Upstream) -> list[dict[str, Any]]:
    assert isinstance(upstream, OpenAIUpstream)
    return list(upstream.usages)


# Responses API ------------------------------------------------------------------------------------------------------


def _items(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A chat message as Responses API input items."""
    if message["role"] == "tool":
        return [{"type": "function_call_output", "call_id": message["tool_call_id"], "output": message["content"]}]
    if message.get("tool_calls"):
        return [
            {"type": "function_call", "call_id": id, "name": name, "arguments": arguments}
            for id, name, arguments in _calls(message)
        ]
    return [{"role": message["role"], "content": message["content"]}]


def _responses_body(conversation: Conversation, n: int) -> dict[str, Any]:
    return {
        "model": RESPONSES.model,
        "instructions": conversation.system,
        "max_output_tokens": MAX_OUTPUT,
        "tools": [{"type": "function", **tool} for tool in conversation.tools],
        "store": False,
        "input": [item for message in conversation.messages[1:n] for item in _items(message)],
    }


def _responses_install(upstream: Upstream, answers: Script) -> None:
    assert isinstance(upstream, OpenAIUpstream)

    def respond(request: dict[str, Any]) -> ResponsesReply:
        last = request["input"][-1]
        output = last.get("type") == "function_call_output"
        key = ("tool", str(last["call_id"])) if output else ("user", _text(last.get("content")))
        message = answers[key]
        calls = tuple(FunctionCall(name, arguments, call_id=id) for id, name, arguments in _calls(message))
        return ResponsesReply(text=message.get("content"), function_calls=calls)

    upstream.responses_responder = respond


def _responses_usages(upstream: Upstream) -> list[dict[str, Any]]:
    assert isinstance(upstream, OpenAIUpstream)
    return [
        {
            "prompt_tokens": usage["input_tokens"],
            "prompt_tokens_details": {"cached_tokens": usage["input_tokens_details"]["cached_tokens"]},
            "completion_tokens": usage["output_tokens"],
        }
        for usage in upstream.responses_usages
    ]


# Messages API -------------------------------------------------------------------------------------------------------


def _blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An assistant message's tool calls as `tool_use` blocks."""
    return [
        {"type": "tool_use", "id": id, "name": name, "input": json.loads(arguments)}
        for id, name, arguments in _calls(message)
    ]


def _messages_body(conversation: Conversation, n: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for message in conversation.messages[1:n]:
        if message["role"] == "tool":
            result = {"type": "tool_result", "tool_use_id": message["tool_call_id"], "content": message["content"]}
            if messages[-1]["role"] == "user":
                messages[-1]["content"].append(result)
            else:
                messages.append({"role": "user", "content": [result]})
        elif message.get("tool_calls"):
            messages.append({"role": "assistant", "content": _blocks(message)})
        else:
            messages.append({"role": message["role"], "content": message["content"]})
    last = messages[-1]
    blocks = [{"type": "text", "text": last["content"]}] if isinstance(last["content"], str) else last["content"]
    messages[-1] = {**last, "content": [*blocks[:-1], {**blocks[-1], "cache_control": {"type": "ephemeral"}}]}
    tools = [
        {"name": tool["name"], "description": tool["description"], "input_schema": tool["parameters"]}
        for tool in conversation.tools
    ]
    return {
        "model": MESSAGES.model,
        "max_tokens": MAX_OUTPUT,
        "system": conversation.system,
        "tools": tools,
        "messages": messages,
    }


def _messages_install(upstream: Upstream, answers: Script) -> None:
    assert isinstance(upstream, AnthropicUpstream)

    def respond(body: Mapping[str, Any]) -> list[dict[str, Any]]:
        content = body["messages"][-1]["content"]
        blocks = content if isinstance(content, list) else []
        results = [block for block in blocks if block.get("type") == "tool_result"]
        key = ("tool", str(results[-1]["tool_use_id"])) if results else ("user", _text(content))
        message = answers[key]
        text = [{"type": "text", "text": message["content"]}] if message.get("content") else []
        return text + _blocks(message)

    upstream.responder = respond


_CACHE_KINDS: Final = ("cache_creation_input_tokens", "cache_read_input_tokens")


def _messages_usages(upstream: Upstream) -> list[dict[str, Any]]:
    assert isinstance(upstream, AnthropicUpstream)
    return [
        {
            "prompt_tokens": sum(usage[kind] for kind in ("input_tokens", *_CACHE_KINDS)),
            "prompt_tokens_details": {"cached_tokens": usage["cache_read_input_tokens"]},
            "completion_tokens": usage["output_tokens"],
        }
        for usage in upstream.usages
    ]


WIRES: Final = (
    Wire(CHAT_COMPLETIONS, _chat_body, _chat_install, _chat_usages),
    Wire(RESPONSES, _responses_body, _responses_install, _responses_usages),
    Wire(MESSAGES, _messages_body, _messages_install, _messages_usages),
)
"""The three wire formats, by `Wire.name`."""
