"""The proxy's read tool: its declaration, and what a request holding offloaded results gets.

Each wire format wraps the declaration in its own tool shape (`WireFormat.read_tool`). The tool is added to a forwarded
request only when its conversation holds offloaded results, after the client's own tools, so the request's prefix (tools
come first in what the provider caches) is the same on every turn that holds them. Whether a conversation holds them is
read from the compaction metadata of the messages forwarded, which rewrite memory replays turn after turn: the same
messages always get the same tools.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, Final, TypeVar

import orjson

from proxy.engine.counting import counter_for_model
from proxy.engine.strategies.offload import REFERENCE_PREFIX
from proxy.pipeline.wire import WireFormat, WireRequest

R = TypeVar("R", bound=WireRequest)

READ_TOOL: Final = "compaction_proxy_read_result"
"""The name of the proxy's read tool; the model calls it with `{"reference": ...}`."""

POINTER: Final = (
    f"Tool result offloaded under reference '{{reference}}'. To read it in full, call {READ_TOOL} with this reference."
)
"""What stands in for an offloaded result in the proxy (`ToolResultOffload`'s placeholders), naming the read tool; the
digest that follows it (`proxy.engine.digest`) says what the result held."""

USER_POINTER: Final = (
    "[User message offloaded ({characters} characters) under reference '{reference}'. To read it in full, call "
    f"{READ_TOOL} with this reference. It opens: {{preview}}]"
)
"""What stands in for a user message the user message window offloaded, naming the read tool."""

_DESCRIPTION: Final = (
    "Read the full text of an earlier tool result or user message that was offloaded to save context. Pass the "
    "reference quoted in its placeholder."
)
_PARAMETERS: Final = {
    "type": "object",
    "properties": {"reference": {"type": "string", "description": "The reference quoted in the placeholder."}},
    "required": ["reference"],
    "additionalProperties": False,
}
READ_TOOL_DECLARATION: Final = {"name": READ_TOOL, "description": _DESCRIPTION, "parameters": _PARAMETERS}
"""The read tool's name, description and JSON schema; each wire format wraps them in its own tool shape."""

_REFERENCE: Final = re.compile(re.escape(REFERENCE_PREFIX) + r"[0-9a-f]{32}")
"""What `content_reference` makes; anything else a model passes names nothing the proxy holds."""


def as_forwarded(request: R, tool: Mapping[str, Any], offered: bool, max_tools: int) -> R:
    """The request as it goes upstream: with the read tool when it is `offered`.

    It is when the request holds offloaded results, or its conversation was sent the tool before
    (`proxy.pipeline.offload.offloading.Offloading.offer`).

    Forwarding and the summary call both take their tools from here: a summary call that lacked the read tool its
    conversation was forwarded with would share no prefix with it (tools come first), and miss the prompt cache.
    Never to a request the read tool cannot be offered to (`offer_declined`).
    """
    return with_read_tool(request, tool) if offered and offer_declined(request, max_tools) is None else request


def read_tool_tokens(request: WireRequest, wire: WireFormat, max_tools: int) -> int:
    """What offering the read tool adds to `request`, counted as its format counts tools; 0 when it cannot be offered.

    Its declaration, and on the Messages API the tool-use system prompt a request without tools does not pay for.
    Counted with the model's counter, in the unit of the compaction target. Providers render tool schemas their own
    way: the declaration is counted both as the engine renders tools (`overhead_tokens`) and as the JSON the request
    carries, and the larger is taken, so that the request with the tool stays within the target either way.
    """
    offered = as_forwarded(request, wire.read_tool, True, max_tools)
    if offered is request:
        return 0
    counter = counter_for_model(request.model)
    rendered = counter.overhead_tokens(offered.overhead_fields) - counter.overhead_tokens(request.overhead_fields)
    declared = counter.text_tokens(orjson.dumps([wire.read_tool]).decode())
    return max(rendered, declared, 0) + max(offered.added_prompt_tokens - request.added_prompt_tokens, 0)


def offer_declined(request: WireRequest, max_tools: int) -> str | None:
    """Why the read tool cannot be offered to this request, or None when it can.

    `name_taken`: one of the client's tools already has its name; offering it again would send the name twice, and
    the proxy could not tell the client's calls from its own. `tool_limit`: the request already has `max_tools`
    tools, so one more would be refused. The proxy's tool is never renamed instead: its name is quoted in every
    pointer rewrite memory replays, which must read the same on every turn.
    """
    tools: Any = request.body.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    if any(_tool_name(tool) == READ_TOOL for tool in tools):
        return "name_taken"
    return "tool_limit" if len(tools) >= max_tools else None


def _tool_name(tool: Any) -> Any:
    """The name a tool declares, at its top (`name`) or in its function (`function.name`), as formats put it."""
    if not isinstance(tool, dict):
        return None
    function = tool.get("function")
    return function.get("name") if isinstance(function, dict) else tool.get("name")


def with_read_tool(request: R, tool: Mapping[str, Any]) -> R:
    """The request with the read `tool` (its format's declaration) after its own tools, all else as it was."""
    tools: Any = request.body.get("tools")
    body = {**request.body, "tools": [*(tools if isinstance(tools, list) else []), tool]}
    return dataclasses.replace(request, body=body)  # type: ignore[type-var]


def reference_of(arguments: Any) -> str | None:
    """The reference a read call names in its JSON arguments, when it is one the proxy could have made."""
    if not isinstance(arguments, str) or len(arguments) > 1024:
        return None
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return None
    reference = parsed.get("reference") if isinstance(parsed, dict) else None
    return reference if isinstance(reference, str) and _REFERENCE.fullmatch(reference) else None
