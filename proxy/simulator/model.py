"""The simulated model: one loopback server answering all three wire formats, an agent that uses its tools.

`Simulator` serves OpenAI's chat completions and Responses API (`OpenAIUpstream`) and Anthropic's Messages API
(`AnthropicUpstream`) on one port, every model with one context window, listed on `/v1/models` with that window
(`max_model_len`, as vLLM lists it) so a proxy in front of it discovers the window by itself. Its model works like a
tool-using agent: after each user message it calls the first tool the request offers `steps` times, one call per
turn, with arguments made from the tool's schema, then answers in text; a request offering no tools gets text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from proxy.simulator import anthropic_upstream
from proxy.simulator.anthropic_upstream import AnthropicUpstream
from proxy.simulator.chat_replies import Reply, Responder, default_responder, tool_loop_responder
from proxy.simulator.openai_upstream import OpenAIUpstream
from proxy.simulator.responses_api import (
    ResponsesReply,
    ResponsesResponder,
    default_responses_responder,
    responses_tool_loop_responder,
)
from proxy.simulator.side_routes import models_response

__all__ = ["DEFAULT_STEPS", "DEFAULT_WINDOW", "Simulator", "offered_tool", "tool_arguments"]

DEFAULT_WINDOW = 16_000
"""The simulator's context window unless told: small, so a conversation outgrows it within a minute."""

DEFAULT_STEPS = 4
"""Tool calls the model makes after each user message before it answers."""


def offered_tool(tools: object, tool_choice: object = None) -> tuple[str, Mapping[str, Any]] | None:
    """The name and parameter schema of the first function tool in `tools`, in any of the three formats.

    None when `tool_choice` forbids calls (`"none"`, or Anthropic's `{"type": "none"}`), as the providers honour it:
    the proxy's summary requests ask for text that way.
    """
    if tool_choice == "none" or (isinstance(tool_choice, Mapping) and tool_choice.get("type") == "none"):
        return None
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, Mapping) or tool.get("type", "function") not in ("function", "custom"):
            continue
        function = tool.get("function")
        declared: Mapping[str, Any] = function if isinstance(function, Mapping) else tool
        name = declared.get("name")
        schema = declared.get("parameters") or declared.get("input_schema") or {}
        if isinstance(name, str):
            return name, schema if isinstance(schema, Mapping) else {}
    return None


def tool_arguments(schema: Mapping[str, Any], turn: int, step: int) -> dict[str, Any]:
    """Arguments for a call at `step` of user `turn`: a value of its type for each required property (or each one)."""
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    required = schema.get("required")
    names = [name for name in required if name in properties] if isinstance(required, list) else list(properties)
    values = {"integer": step, "number": step, "boolean": True, "array": [], "object": {}}
    arguments: dict[str, Any] = {}
    for name in names:
        kind = properties[name].get("type") if isinstance(properties[name], Mapping) else None
        arguments[name] = values.get(kind, f"{name}-{turn}-{step}") if isinstance(kind, str) else f"{name}-{turn}"
    return arguments


def _chat_model(steps: int) -> Responder:
    def respond(body: dict[str, Any]) -> Reply:
        offered = offered_tool(body.get("tools"), body.get("tool_choice"))
        if offered is None:
            return default_responder(body)
        name, schema = offered
        turn = _user_turns(body["messages"], "role")
        return tool_loop_responder(name, steps, arguments=lambda step, _k: tool_arguments(schema, turn, step))(body)

    return respond


def _responses_model(steps: int) -> ResponsesResponder:
    def respond(body: dict[str, Any]) -> ResponsesReply:
        offered = offered_tool(body.get("tools"), body.get("tool_choice"))
        if offered is None:
            return default_responses_responder(body)
        name, schema = offered
        turn = _user_turns(body["input"], "role")

        def arguments(step: int, _k: int) -> dict[str, Any]:
            return tool_arguments(schema, turn, step)

        return responses_tool_loop_responder(name, steps, reasoning=False, arguments=arguments)(body)

    return respond


def _messages_model(steps: int) -> anthropic_upstream.Responder:
    def respond(body: Mapping[str, Any]) -> list[dict[str, Any]]:
        offered = offered_tool(body.get("tools"), body.get("tool_choice"))
        name, schema = offered if offered is not None else (None, {})

        def arguments(turn: int, step: int) -> dict[str, Any]:
            return tool_arguments(schema, turn, step + 1)

        return anthropic_upstream.tool_loop_responder(name, steps, arguments=arguments)(body)

    return respond


def _user_turns(entries: Sequence[Any], key: str) -> int:
    return sum(1 for entry in entries if isinstance(entry, Mapping) and entry.get(key) == "user")


class Simulator(OpenAIUpstream):
    """The three formats on one loopback port, every model with one window (see the module docstring).

    :param context_window: Every model's window, in tokens.
    :param steps: Tool calls after each user message before the model answers in text.
    :param host: Interface to bind; loopback by default.
    :param port: Port to bind; 0 picks a free one (read `base_url` once started).

    `messages_api` is the Messages API's side (its `usages`, `requests`); the rest is `OpenAIUpstream`'s.
    """

    def __init__(
        self,
        *,
        context_window: int = DEFAULT_WINDOW,
        steps: int = DEFAULT_STEPS,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(
            _chat_model(steps),
            context_window=context_window,
            host=host,
            port=port,
            responses_responder=_responses_model(steps),
        )
        self.messages_api = AnthropicUpstream(context_window=context_window, responder=_messages_model(steps))

    def add_routes(self, app: web.Application) -> None:
        """The Messages API's routes, then OpenAI's (whose last route answers any other path with a 404)."""
        self.messages_api.add_routes(app)
        super().add_routes(app)

    async def _list_models(self, request: web.Request) -> web.Response:
        return models_response(self.models, window_for=self.window_for)

    async def _get_model(self, request: web.Request) -> web.Response:
        return models_response(self.models, request.match_info["model"], self.window_for)
