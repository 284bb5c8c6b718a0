"""What the fake upstream's Responses API answers: replies, responders, and the `response` objects built from them.

A `ResponsesResponder` maps the request (its body, with `input` replaced by the list of items the model sees,
see `proxy.simulator.responses_tokens.visible_items`) to a `ResponsesReply`: optional reasoning, optional text,
and function calls. `build_output` turns the reply into output items with OpenAI-looking ids (`rs_...`,
`msg_...`, `fc_...`, `cmp_...`) and says, for each, what the reasoning rules must remember about it
(`proxy.simulator.responses_items.ItemOrigin`). `response_object` wraps them into the `response` object with usage.

`max_output_tokens` cuts the text (never the reasoning or the calls) so the output fits, and then the response is
"incomplete" with reason "max_output_tokens", as OpenAI reports a cut answer.

Output tokens: a reasoning item costs `reasoning_tokens` (its hidden reasoning) plus its summary, a message its
text, a function call its name and arguments. The reasoning item's `encrypted_content` (sent only when `include`
asks for `reasoning.encrypted_content`) is built to count exactly `reasoning_tokens` when it is sent back as input.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.engine.encodings import get_encoding
from proxy.simulator.openai_common import tool_call_id
from proxy.simulator.openai_tokens import count_text, encode
from proxy.simulator.responses_items import ItemOrigin, item_shape, item_type
from proxy.simulator.responses_tokens import compaction_blob, opaque_blob

__all__ = [
    "FunctionCall",
    "IssuedOutput",
    "ResponsesReply",
    "ResponsesResponder",
    "build_output",
    "compaction_item",
    "default_responses_responder",
    "fake_id",
    "limit_reply",
    "response_object",
    "responses_tool_loop_responder",
    "responses_usage",
]

DEFAULT_REASONING_TOKENS = 32


@dataclass(frozen=True)
class FunctionCall:
    """One function call the fake model makes; `call_id` defaults to one derived from the response and position."""

    name: str
    arguments: str = "{}"
    call_id: str | None = None


@dataclass(frozen=True)
class ResponsesReply:
    """What the fake model answers on the Responses API, in output order: reasoning, text, then function calls.

    `reasoning` emits a reasoning item (with `reasoning_summary` as its one summary part, if not empty) that costs
    `reasoning_tokens` output tokens besides its summary.
    """

    text: str | None = None
    function_calls: tuple[FunctionCall, ...] = ()
    reasoning: bool = False
    reasoning_summary: str = ""
    reasoning_tokens: int = DEFAULT_REASONING_TOKENS


ResponsesResponder = Callable[[dict[str, Any]], ResponsesReply]
"""Maps the request as the model sees it (`input`: the visible item list) to the reply. Must be deterministic."""


def default_responses_responder(request: dict[str, Any]) -> ResponsesReply:
    """Answer with a short text that depends on the request: "ok <n> items"."""
    return ResponsesReply(text=f"ok {len(request['input'])} items")


def responses_tool_loop_responder(
    tool_name: str = "run",
    steps: int = 3,
    *,
    reasoning: bool = True,
    parallel: int = 1,
    arguments: Callable[[int, int], Mapping[str, Any]] | None = None,
    final_text: str | None = None,
) -> ResponsesResponder:
    """Drive an agent loop: after a user message, call `tool_name` until `steps` calls were answered, then answer.

    Each step makes up to `parallel` calls (never more than `steps` in all since the latest user message the model
    sees), preceded by a reasoning item when `reasoning`. The final text defaults to "done: <n> tool calls".
    Arguments default to `{"step": s, "call": k}`. Call ids derive only from the conversation (the latest user
    message, and the first item seen, which after a compaction is the compaction item), so a replayed request gets
    the same ones and a new window new ones.
    """

    def respond(request: dict[str, Any]) -> ResponsesReply:
        items: list[dict[str, Any]] = request["input"]
        last_user = max((i for i, item in enumerate(items) if _is_user_message(item)), default=-1)
        answered = sum(1 for item in items[last_user + 1 :] if item_type(item) == "function_call_output")
        last = items[-1] if items else {}
        if answered >= steps or not (_is_user_message(last) or item_type(last) == "function_call_output"):
            text = final_text if final_text is not None else f"done: {answered} tool calls"
            return ResponsesReply(text=text, reasoning=reasoning, reasoning_summary="Answering." if reasoning else "")
        step = answered + 1
        turn = sum(1 for item in items if _is_user_message(item))
        anchor = (_text(items[last_user]) if last_user >= 0 else "", items[0].get("id") if items else None)
        calls = tuple(
            FunctionCall(
                name=tool_name,
                arguments=json.dumps(dict(arguments(step, k)) if arguments else {"step": step, "call": k}),
                call_id=tool_call_id("responses", turn, anchor, answered, k),
            )
            for k in range(min(parallel, steps - answered))
        )
        summary = f"Calling {tool_name}, step {step}." if reasoning else ""
        return ResponsesReply(function_calls=calls, reasoning=reasoning, reasoning_summary=summary)

    return respond


def _is_user_message(item: Mapping[str, Any]) -> bool:
    return item_type(item) == "message" and item.get("role") == "user"


def _text(item: Mapping[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text", "")) for p in content or () if isinstance(p, Mapping))


def fake_id(prefix: str, *parts: object) -> str:
    """An OpenAI-looking id: `prefix` + "_" + 48 hex characters derived from `parts`."""
    return f"{prefix}_{hashlib.sha256(repr(parts).encode()).hexdigest()[:48]}"


@dataclass(frozen=True)
class IssuedOutput:
    """Output items built for one response, each with what the reasoning rules remember about it, and the cost."""

    items: list[dict[str, Any]]
    origins: dict[str, ItemOrigin]
    output_tokens: int
    reasoning_tokens: int


def compaction_item(seed: str, tokens: int, *, keeps_user_messages: bool) -> dict[str, Any]:
    """A compaction item (`cmp_...`) whose opaque content counts `tokens` tokens as input."""
    return {
        "id": fake_id("cmp", seed),
        "type": "compaction",
        "encrypted_content": compaction_blob(seed, tokens, keeps_user_messages=keeps_user_messages),
    }


def limit_reply(reply: ResponsesReply, limit: int | None, encoding_name: str) -> tuple[ResponsesReply, bool]:
    """Cut the reply's text so its output fits `limit` tokens; say whether anything was cut."""
    if not limit or reply.text is None:
        return reply, False
    others = build_output(replace(reply, text=None), "", encrypted_reasoning=False, encoding_name=encoding_name)
    tokens = encode(reply.text, encoding_name)
    room = max(0, limit - others.output_tokens)
    if len(tokens) <= room:
        return reply, False
    return replace(reply, text=get_encoding(encoding_name).decode(list(tokens[:room]))), True


def build_output(
    reply: ResponsesReply,
    response_id: str,
    *,
    encrypted_reasoning: bool,
    encoding_name: str,
    incomplete: bool = False,
) -> IssuedOutput:
    """Turn `reply` into output items with ids, in order: reasoning, message (incomplete if cut), function calls."""
    items: list[dict[str, Any]] = []
    output_tokens = reasoning_tokens = 0
    if reply.reasoning:
        summary = [{"type": "summary_text", "text": reply.reasoning_summary}] if reply.reasoning_summary else []
        item: dict[str, Any] = {"id": fake_id("rs", response_id), "type": "reasoning", "summary": summary}
        if encrypted_reasoning:
            seed = f"{response_id}:reasoning"
            item["encrypted_content"] = opaque_blob(f"fake-reasoning:{seed}", reply.reasoning_tokens)
        items.append(item)
        reasoning_tokens = reply.reasoning_tokens + count_text(reply.reasoning_summary, encoding_name)
        output_tokens += reasoning_tokens
    if reply.text is not None:
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": reply.text}
        status = "incomplete" if incomplete else "completed"
        message = {"id": fake_id("msg", response_id), "type": "message", "status": status}
        items.append({**message, "role": "assistant", "content": [part]})
        output_tokens += count_text(reply.text, encoding_name)
    for k, call in enumerate(reply.function_calls):
        items.append(
            {
                "id": fake_id("fc", response_id, k),
                "type": "function_call",
                "status": "completed",
                "arguments": call.arguments,
                "call_id": call.call_id or tool_call_id(response_id, k),
                "name": call.name,
            }
        )
        output_tokens += count_text(call.name, encoding_name) + count_text(call.arguments, encoding_name)
    return IssuedOutput(items, _origins(items, response_id), output_tokens, reasoning_tokens)


def _origins(items: Sequence[Mapping[str, Any]], response_id: str) -> dict[str, ItemOrigin]:
    origins: dict[str, ItemOrigin] = {}
    reasoning: str | None = None
    for index, item in enumerate(items):
        kind = item_type(item)
        following = None
        if kind == "reasoning" and index + 1 < len(items):
            following = (str(items[index + 1]["id"]), item_shape(items[index + 1]))
        origins[str(item["id"])] = ItemOrigin(response_id, kind, reasoning, following)
        if kind == "reasoning":
            reasoning = str(item["id"])
    return origins


def responses_usage(input_tokens: int, cached_tokens: int, output_tokens: int, reasoning_tokens: int) -> dict[str, Any]:
    """The `usage` object of a response."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }


def response_object(
    response_id: str,
    body: Mapping[str, Any],
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    *,
    status: str = "completed",
    incomplete_reason: str | None = None,
) -> dict[str, Any]:
    """The `response` object for `body` (request parameters echoed as OpenAI echoes them)."""
    now = int(time.time())
    reasoning = body.get("reasoning")
    if not isinstance(reasoning, dict):
        reasoning = {}
    return {
        "id": response_id,
        "object": "response",
        "created_at": now,
        "status": status,
        "background": False,
        "completed_at": now if status == "completed" else None,
        "error": None,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"),
        "model": body["model"],
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "safety_identifier": body.get("safety_identifier"),
        "service_tier": "default",
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_logprobs": body.get("top_logprobs", 0),
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation") or "disabled",
        "usage": usage,
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }
