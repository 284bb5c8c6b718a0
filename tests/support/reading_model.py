"""A fake model that reads offloaded results back through the proxy's tool, for the fake upstream's responders.

When the request offers the read tool and the conversation quotes references to offloaded results, the model calls
the tool once per reference (all in one answer); once the results are there, it answers with the secret markers
(`SECRET-<digits>`) it found in them, so a test can tell a read that reached the content from one that did not.
Without the tool, or without references, it answers `PLAIN_ANSWER`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from proxy.pipeline.offload.tool import READ_TOOL
from proxy.simulator.anthropic_rules import blocks_of
from proxy.simulator.openai_upstream import Reply, ToolCall
from proxy.simulator.responses_api import FunctionCall, ResponsesReply

PLAIN_ANSWER: Final = "plain answer"
READ_ID_PREFIX: Final = "read-"
_REFERENCE: Final = re.compile(r"offloaded-[0-9a-f]{32}")
_SECRET: Final = re.compile(r"SECRET-\d+")


def found_answer(texts: Iterable[str]) -> str:
    """What the model answers after reading `texts`."""
    secrets = [secret for text in texts for secret in _SECRET.findall(text)]
    return "found " + (",".join(secrets) if secrets else "nothing")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def _texts(value: Any) -> list[str]:
    """Every string inside a value, at any depth."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [text for item in value.values() for text in _texts(item)]
    if isinstance(value, list):
        return [text for item in value for text in _texts(item)]
    return []


def _references(texts: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(reference for text in texts for reference in _REFERENCE.findall(text)))


def _arguments(reference: str) -> str:
    return json.dumps({"reference": reference})


def reading_chat_responder(request: dict[str, Any]) -> Reply:
    """The chat model (see the module docstring)."""
    messages: list[dict[str, Any]] = request["messages"]
    last_user = max(i for i, message in enumerate(messages) if message.get("role") == "user")
    read = [
        _text(message.get("content"))
        for message in messages[last_user + 1 :]
        if message.get("role") == "tool" and str(message.get("tool_call_id")).startswith(READ_ID_PREFIX)
    ]
    if read:
        return Reply(content=found_answer(read))
    offered = any(tool.get("function", {}).get("name") == READ_TOOL for tool in request.get("tools") or ())
    references = _references(_text(message.get("content")) for message in messages)
    if not offered or not references:
        return Reply(content=PLAIN_ANSWER)
    calls = (ToolCall(f"{READ_ID_PREFIX}{k}", READ_TOOL, _arguments(ref)) for k, ref in enumerate(references))
    return Reply(tool_calls=tuple(calls))


def reading_responses_responder(request: dict[str, Any]) -> ResponsesReply:
    """The Responses model (see the module docstring)."""
    items: list[dict[str, Any]] = request["input"]
    last_user = max(i for i, item in enumerate(items) if item.get("role") == "user")
    read = [
        str(item.get("output"))
        for item in items[last_user + 1 :]
        if item.get("type") == "function_call_output" and str(item.get("call_id")).startswith(READ_ID_PREFIX)
    ]
    if read:
        return ResponsesReply(text=found_answer(read))
    offered = any(tool.get("name") == READ_TOOL for tool in request.get("tools") or ())
    texts = (_text(item.get("content")) + str(item.get("output", "")) for item in items)
    references = _references(texts)
    if not offered or not references:
        return ResponsesReply(text=PLAIN_ANSWER)
    calls = (
        FunctionCall(READ_TOOL, _arguments(ref), call_id=f"{READ_ID_PREFIX}{k}") for k, ref in enumerate(references)
    )
    return ResponsesReply(function_calls=tuple(calls))


def reading_messages_responder(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Messages model (see the module docstring): its answer's content blocks."""
    messages: list[dict[str, Any]] = request["messages"]
    read = [
        text
        for block in blocks_of(messages[-1])
        if block.get("type") == "tool_result" and str(block.get("tool_use_id")).startswith("toolu_read")
        for text in _texts(block.get("content"))
    ]
    if read:
        return [{"type": "text", "text": found_answer(read)}]
    offered = any(tool.get("name") == READ_TOOL for tool in request.get("tools") or ())
    references = _references(_texts(messages))
    if not offered or not references:
        return [{"type": "text", "text": PLAIN_ANSWER}]
    return [
        {"type": "tool_use", "id": f"toolu_read{k}", "name": READ_TOOL, "input": {"reference": reference}}
        for k, reference in enumerate(references)
    ]
