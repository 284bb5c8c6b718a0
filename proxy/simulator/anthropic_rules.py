"""The Messages API's rules as the fake Anthropic upstream enforces them, with the API's own error texts.

Deliberately independent of `proxy.formats.anthropic` (it shares only the shipped tiktoken encodings), so a bug in
the proxy's reading of the rules cannot hide in the fake.

- **Shape**: `model`, a positive `max_tokens`, a non-empty `messages` list of user, assistant or system messages.
- **Cache breakpoints**: at most 4 `cache_control` blocks over tools, system and messages (tool results' blocks too).
- **Tool pairing**: the message after an assistant's `tool_use` blocks is a user message that *begins* with a
  `tool_result` for each of them; every `tool_result` answers a `tool_use` of the message before.
- **Thinking**: every `thinking` block's `signature` (and every `redacted_thinking` block's `data`) must be one this
  fake issued (`Signer`): over the thinking alone, and on the models that bind (`BINDING_MODELS`), over everything
  before the block too (`prefix_bytes`). On a binding model a block failing that prefix check, and every later one,
  makes a 400 unless the request sets `thinking.block_binding.prefix_mismatch_behavior: "drop_block"` (with its beta
  header): then they are dropped. With thinking on, a turn being continued must start with a thinking block, except
  on a binding model, where removing thinking is a documented remedy (the error's own "Remove the block, or set ...",
  and "remove thinking manually" in ".../preserved-thinking/fix-bound-to-a-different-conversation").

  The prefix check is Anthropic's as documented ("Preserved thinking" and "Prefix checks on thinking blocks",
  https://platform.claude.com/docs/en/build-with-claude/preserved-thinking and .../preserved-thinking/prefix-checks,
  read 2026-12-04): "The top-level `system` prompt, `tools`, and `messages` before the block are its prefix. If the
  prefix differs from what you sent when the block was produced, that block and every later thinking block are
  invalid"; it "also fails if a thinking block between others was left out or moved". So every earlier message
  counts, whatever its role (a mid-conversation `system` message too: "Per-message effort" says not to move or
  delete one, as that invalidates the thinking after it), with every field it has, and the blocks before the
  thinking block in its own message. `cache_control` is left out of the comparison (LiteLLM's "Preserved Thinking
  Prefix Stability", https://docs.litellm.ai/docs/providers/anthropic_preserved_thinking). The fake is a new account:
  the check is enforced by default "for accounts created on or after August 31, 2026"; older accounts get it only
  when the request sets `thinking.block_binding.prefix_mismatch_behavior`. Claude Code 2.1.332 fails it on these
  models as the tests run it (a custom `ANTHROPIC_BASE_URL`): it appends a per-turn hint to its newest system message
  and removes it on the next turn, gets the 400, and sends the request again without thinking. (Its binary can send
  the hint as a `clear_at: "next_user_message"` system message instead, under the beta
  `mid-conversation-system-clear-at-2026-08-21`; it did not here, and this fake does not model `clear_at`.)
- **Tokens**: everything is counted (`prompt_segments`); a prompt over the window is refused with "prompt is too
  long: N tokens > M maximum", or on the older models (`LEGACY_LIMIT_MODELS`) when prompt and `max_tokens` exceed it
  with "input length and `max_tokens` exceed context limit: A + B > C, ...".
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.engine.encodings import get_encoding

BINDING_MODELS = ("claude-fable-5-1", "claude-fable-5-2", "claude-opus-5-5", "claude-sonnet-5-5", "claude-haiku-5-5")
LEGACY_LIMIT_MODELS = ("claude-3",)
BINDING_BETA = "thinking-binding-controls-2026-08-01"
MAX_BREAKPOINTS = 4
TOOL_PROMPT_TOKENS = 346
MESSAGE_TOKENS = 3
THINKING = ("thinking", "redacted_thinking")


class AnthropicError(Exception):
    """An error the fake answers with the API's body: `{"type": "error", "error": {"type", "message"}}`."""

    def __init__(self, message: str, *, status: int = 400, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.body = {"type": "error", "error": {"type": kind, "message": message}}


def _type(block: Any) -> str:
    kind = block.get("type") if isinstance(block, Mapping) else None
    return kind if isinstance(kind, str) else ""


def blocks_of(message: Mapping[str, Any]) -> list[Any]:
    """A message's content as blocks (a string is one text block)."""
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def canonical(value: Any) -> bytes:
    """`value` as sorted JSON without `cache_control`, strings as text blocks where content may be either."""

    def strip(item: Any) -> Any:
        if isinstance(item, Mapping):
            return {key: strip(inner) for key, inner in item.items() if key != "cache_control"}
        if isinstance(item, list):
            return [strip(inner) for inner in item]
        return item

    return json.dumps(strip(value), sort_keys=True, separators=(",", ":")).encode()


class Signer:
    """Signs the thinking this fake emits and checks what comes back.

    A signature is a MAC over the thinking, then, for a block made by a binding model, `~` and a MAC over the
    thinking and the digest of everything before it (`prefix_bytes`).
    """

    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, *parts: bytes) -> str:
        return base64.b64encode(hmac.new(self._key, b"\0".join(parts), hashlib.sha256).digest()).decode()

    def sign(self, thinking: str, prefix: bytes | None) -> str:
        """A signature over `thinking` and, when given, what came before it."""
        own = self._mac(b"content", thinking.encode())
        if prefix is None:
            return own
        return own + "~" + self._mac(b"prefix", thinking.encode(), hashlib.sha256(prefix).digest())

    def redacted(self, payload: str, prefix: bytes | None) -> str:
        """A `redacted_thinking` block's `data`: the payload and its signature."""
        return payload + "." + self.sign(payload, prefix)

    @staticmethod
    def _parts(block: Mapping[str, Any]) -> tuple[str, str]:
        if _type(block) == "thinking":
            thinking, signature = block.get("thinking"), block.get("signature")
            return (thinking, signature) if isinstance(thinking, str) and isinstance(signature, str) else ("", "")
        data = block.get("data")
        payload, _, signature = data.rpartition(".") if isinstance(data, str) else ("", "", "")
        return payload, signature

    def content_verifies(self, block: Mapping[str, Any]) -> bool:
        """Whether the block's thinking is what this fake signed, unaltered."""
        thinking, signature = self._parts(block)
        return bool(signature) and hmac.compare_digest(
            self._mac(b"content", thinking.encode()), signature.split("~")[0]
        )

    def prefix_verifies(self, block: Mapping[str, Any], prefix: bytes) -> bool:
        """Whether the block was made after exactly `prefix`."""
        thinking, signature = self._parts(block)
        bound = signature.partition("~")[2]
        expected = self._mac(b"prefix", thinking.encode(), hashlib.sha256(prefix).digest())
        return bool(bound) and hmac.compare_digest(expected, bound)


def binds(model: str) -> bool:
    """Whether `model` binds its thinking blocks to their prefix (`BINDING_MODELS`)."""
    return model.startswith(BINDING_MODELS)


def prefix_bytes(body: Mapping[str, Any], messages: Sequence[Mapping[str, Any]], blocks: Sequence[Any]) -> bytes:
    """What a thinking block is bound to: tools, system, earlier messages (every field), blocks before it."""
    system = body.get("system")
    head = [body.get("tools") or [], [{"type": "text", "text": system}] if isinstance(system, str) else system or []]
    earlier = [{**message, "content": blocks_of(message)} for message in messages]
    return canonical([head, earlier, list(blocks)])


def check_shape(body: Mapping[str, Any], headers: Mapping[str, str]) -> None:
    """Refuse a request missing `model`, `max_tokens` or `messages`, or malformed, with the API's error."""
    for field in ("model", "max_tokens", "messages"):
        if field not in body:
            raise AnthropicError(f"{field}: Field required")
    if not isinstance(body["max_tokens"], int) or body["max_tokens"] < 1:
        raise AnthropicError("max_tokens: Input should be greater than or equal to 1")
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise AnthropicError("messages: at least one message is required")
    for position, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant", "system"):
            raise AnthropicError(f"messages.{position}.role: Input should be 'user', 'assistant' or 'system'")
    thinking = body.get("thinking")
    if isinstance(thinking, Mapping) and "block_binding" in thinking:
        betas = {name.strip() for name in headers.get("anthropic-beta", "").split(",")}
        if BINDING_BETA not in betas:
            raise AnthropicError(
                f"thinking.block_binding: This field requires the `anthropic-beta: {BINDING_BETA}` header."
            )


def check_breakpoints(body: Mapping[str, Any]) -> None:
    """Refuse more than `MAX_BREAKPOINTS` `cache_control` blocks over tools, system and messages."""
    found = [tool for tool in body.get("tools") or () if isinstance(tool, Mapping)]
    system = body.get("system")
    found.extend(block for block in system if isinstance(block, Mapping)) if isinstance(system, list) else None
    for message in body["messages"]:
        for block in blocks_of(message):
            found.append(block)
            inner = block.get("content") if _type(block) == "tool_result" else None
            found.extend(item for item in inner if isinstance(item, Mapping)) if isinstance(inner, list) else None
    count = sum(1 for block in found if isinstance(block, Mapping) and block.get("cache_control") is not None)
    if count > MAX_BREAKPOINTS:
        raise AnthropicError(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {count}."
        )


def check_pairing(messages: Sequence[Mapping[str, Any]]) -> None:
    """Refuse a `tool_use` not answered first thing in the next message, or a `tool_result` answering none."""
    for position, message in enumerate(messages):
        blocks = blocks_of(message)
        uses = [block.get("id") for block in blocks if _type(block) == "tool_use"]
        before = blocks_of(messages[position - 1]) if position else []
        asked = {block.get("id") for block in before if _type(block) == "tool_use"}
        asked = asked if position and messages[position - 1].get("role") == "assistant" else set()
        for index, block in enumerate(blocks):
            if _type(block) == "tool_result" and block.get("tool_use_id") not in asked:
                raise AnthropicError(
                    f"messages.{position}.content.{index}: unexpected `tool_use_id` found in `tool_result` blocks: "
                    f"{block.get('tool_use_id')}. Each `tool_result` block must have a corresponding `tool_use` "
                    "block in the previous message."
                )
        if not uses or message.get("role") != "assistant":
            continue
        following = blocks_of(messages[position + 1]) if position + 1 < len(messages) else []
        answered = {block.get("tool_use_id") for block in following if _type(block) == "tool_result"}
        missing = [str(use) for use in uses if use not in answered]
        if missing:
            raise AnthropicError(
                f"messages.{position}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block in the "
                "next message."
            )
        leading = next((i for i, block in enumerate(following) if _type(block) != "tool_result"), len(following))
        if leading < len(uses) or any(_type(block) == "tool_result" for block in following[leading:]):
            raise AnthropicError(
                f"messages.{position + 1}: Did not find {len(uses)} `tool_result` block(s) at the beginning of this "
                "message. Messages following `tool_use` blocks must begin with a matching number of `tool_result` "
                "blocks."
            )


@dataclass
class Checked:
    """A request that passed the thinking checks: its messages (failing blocks dropped) and what was dropped."""

    messages: list[dict[str, Any]]
    dropped: int


def check_thinking(body: Mapping[str, Any], signer: Signer) -> Checked:
    """Check every thinking block's signature and place (the module docstring's rules); say what was dropped."""
    model = str(body["model"])
    thinking = body.get("thinking")
    binding = thinking.get("block_binding") if isinstance(thinking, Mapping) else None
    drop = isinstance(binding, Mapping) and binding.get("prefix_mismatch_behavior") == "drop_block"
    messages: list[dict[str, Any]] = []
    failed = False
    dropped = 0
    for position, message in enumerate(body["messages"]):
        kept: list[Any] = []
        for index, block in enumerate(blocks_of(message)):
            if _type(block) not in THINKING:
                kept.append(block)
                continue
            if not signer.content_verifies(block):
                raise AnthropicError(f"messages.{position}.content.{index}: Invalid `signature` in `thinking` block")
            failed = failed or (binds(model) and not signer.prefix_verifies(block, prefix_bytes(body, messages, kept)))
            if failed and not drop:
                raise AnthropicError(
                    f"messages.{position}.content.{index}: Invalid `signature` in `thinking` block. The block is "
                    "bound to a different conversation. Remove the block, or set "
                    '`thinking.block_binding.prefix_mismatch_behavior` to "drop_block".'
                )
            if failed:
                dropped += 1
            else:
                kept.append(block)
        messages.append({**message, "content": kept})
    if not binds(model):
        _check_turn_starts_thinking(body)
    return Checked(messages, dropped)


def _check_turn_starts_thinking(body: Mapping[str, Any]) -> None:
    """With thinking on, a continued tool-use turn's first assistant message must start with thinking.

    Mid-conversation system messages between the turn's messages (or after its tool results) do not end it.
    """
    thinking = body.get("thinking")
    messages = body["messages"]
    order = [position for position, message in enumerate(messages) if message.get("role") != "system"]
    if not isinstance(thinking, Mapping) or thinking.get("type") == "disabled" or len(order) < 2:
        return
    last = blocks_of(messages[order[-1]])
    if messages[order[-1]].get("role") != "user" or not last or _type(last[0]) != "tool_result":
        return
    step = len(order) - 2
    while step >= 2 and all(_type(block) == "tool_result" for block in blocks_of(messages[order[step - 1]])):
        step -= 2
    position = order[step]
    first = blocks_of(messages[position])
    # A compaction block stands for everything before it: the API reads the conversation from there.
    if messages[position].get("role") == "assistant" and first and _type(first[0]) not in (*THINKING, "compaction"):
        raise AnthropicError(
            f"messages.{position}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
            f"`{_type(first[0])}`. When `thinking` is enabled, a final `assistant` message must start with a thinking "
            "block (preceeding the lastmost set of `tool_use` and `tool_result` blocks)."
        )


@dataclass(frozen=True)
class Segment:
    """One piece of the prompt, in order: a tool, a system block, a message block."""

    data: bytes
    tokens: int
    breakpoint: bool


def text_tokens(text: str) -> int:
    """The tokens of `text` (cl100k_base, special-token strings as text)."""
    return len(get_encoding("cl100k_base").encode(text, disallowed_special=()))


def block_tokens(block: Any) -> int:
    """The tokens of one content block: its text, thinking, call or result; an image by its size."""
    kind = _type(block)
    if kind == "text":
        return text_tokens(str(block.get("text", "")))
    if kind == "thinking":
        return text_tokens(str(block.get("thinking", "")))
    if kind == "redacted_thinking":
        return 1 + len(str(block.get("data", ""))) // 4
    if kind == "tool_use":
        return text_tokens(str(block.get("name", "")) + json.dumps(block.get("input", {})))
    if kind == "tool_result":
        content = block.get("content")
        inner = content if isinstance(content, list) else [{"type": "text", "text": str(content or "")}]
        return 3 + sum(block_tokens(item) for item in inner)
    if kind == "image":
        return image_tokens(block)
    return text_tokens(json.dumps(block, sort_keys=True))


def image_tokens(block: Mapping[str, Any]) -> int:
    """`width * height / 750` for a base64 PNG, 1,600 for anything else."""
    source = block.get("source")
    data = source.get("data") if isinstance(source, Mapping) else None
    head = base64.b64decode(data[:64]) if isinstance(data, str) else b""
    if head.startswith(b"\x89PNG") and len(head) >= 24:
        width, height = struct.unpack(">II", head[16:24])
        return max(1, int(width) * int(height) // 750)
    return 1600


def prompt_segments(body: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]) -> list[Segment]:
    """The prompt as the model reads it, piece by piece (see `Segment`)."""
    segments: list[Segment] = []
    tools = [tool for tool in body.get("tools") or () if isinstance(tool, Mapping)]
    for position, tool in enumerate(tools):
        extra = TOOL_PROMPT_TOKENS if position == 0 else 0
        tokens = extra + text_tokens(json.dumps(tool, sort_keys=True))
        segments.append(Segment(canonical(tool), tokens, tool.get("cache_control") is not None))
    system = body.get("system")
    for block in [{"type": "text", "text": system}] if isinstance(system, str) else system or []:
        segments.append(Segment(canonical(block), block_tokens(block), block.get("cache_control") is not None))
    for message in messages:
        blocks = blocks_of(message) or [{"type": "text", "text": ""}]
        for index, block in enumerate(blocks):
            role = str(message.get("role")).encode() if index == 0 else b""
            overhead = MESSAGE_TOKENS if index == 0 else 0
            marked = isinstance(block, Mapping) and block.get("cache_control") is not None
            segments.append(Segment(role + canonical(block), overhead + block_tokens(block), marked))
    return segments


def check_window(body: Mapping[str, Any], prompt: int, window: int) -> None:
    """Refuse a `prompt` of so many tokens over `window` with the model's own overflow text."""
    if str(body["model"]).startswith(LEGACY_LIMIT_MODELS):
        reply = int(body["max_tokens"])
        if prompt + reply > window:
            raise AnthropicError(
                f"input length and `max_tokens` exceed context limit: {prompt} + {reply} > {window}, decrease input "
                "length or `max_tokens` and try again"
            )
    elif prompt > window:
        raise AnthropicError(f"prompt is too long: {prompt} tokens > {window} maximum")
