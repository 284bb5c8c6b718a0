"""How each kind of server counts a chat prompt exactly, under its own tokenizer and chat template.

A counting method asks one kind of server, through `fetch`, how many tokens the prompt of a conversation costs
(template, generation prompt and all: the `prompt_tokens` it would report), and returns that count or None. Only
documented fields are read; anything else is None, and the caller falls back to its local count.

- `llama_cpp_template`: llama.cpp's `POST /apply-template` renders the messages with the server's own template, and
  `POST /tokenize` counts the text. The text a conversation renders to without the generation prompt is a prefix of
  what it renders to once more messages follow, so what was rendered for an earlier request of the conversation is
  remembered (its length, a digest and its token count, never the text): the next request tokenizes only the text
  that is new, and asks for the generation prompt once per model and template. Exact wherever the template ends a
  message with a special token or a newline (ChatML, Llama 3, Gemma, Mistral's `[/INST]`); elsewhere a token may
  merge across the cut, off by at most one token per request. A template that renders an earlier part differently
  once more follows (some reasoning templates drop old thinking) fails the digest check and is tokenized whole.
- `vllm_tokenize`: vLLM's (and SGLang's) `POST /tokenize` with `messages` renders and counts the whole conversation
  in one call and answers `count`. It has no way to count only a tail, so each new request costs the server one
  render of the conversation; re-sent requests whose prompt was counted before ask nothing (see
  `proxy.pipeline.exact_counts`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from xxhash import xxh3_128_digest

from proxy.discovery.probes import Fetch
from proxy.engine.bounded import BoundedCache

TEMPLATE_FIELDS: Final = ("tools", "tool_choice", "chat_template_kwargs", "reasoning_effort")
"""Request fields besides `messages` that change what a chat template renders."""
LOOK_BACK: Final = 64
"""How many prefixes back from a request's end a remembered one is looked for: a conversation's next request adds a
few messages, and a bounded look keeps a request of 100,000 new messages from costing as many lookups."""
MAX_RENDERED: Final = 65_536
"""Rendered prefixes (length, digest, tokens: under 100 bytes each) remembered for `llama_cpp_template`."""


@dataclass(frozen=True)
class Conversation:
    """What a counting method counts: a request's messages as the upstream will get them.

    :param model: The model asked for.
    :param messages: The messages, as forwarded.
    :param fields: The request's other fields that change the rendering (`TEMPLATE_FIELDS` present in it).
    :param keys: The keys of each prefix of the messages (the engine's hash chain): `keys[k - 1]` names the first
        `k` messages, so what was learned about a prefix is found again, whatever request it came from.
    :param scope: What every remembered entry is keyed under besides the prefix: the caller's tenant, the model and
        `fields`.
    """

    model: str
    messages: Sequence[Mapping[str, Any]]
    fields: Mapping[str, Any]
    keys: Sequence[bytes]
    scope: bytes


@dataclass(frozen=True)
class _Rendered:
    """A prefix as the template rendered it without the generation prompt: its length, digest and token count."""

    length: int
    digest: bytes
    tokens: int


Method = Callable[[Fetch, Conversation], Awaitable[int | None]]


def _count(value: object) -> int | None:
    """`value` when it is a non-negative int (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _prompt(answer: Any) -> str | None:
    prompt = answer.get("prompt") if isinstance(answer, Mapping) else None
    return prompt if isinstance(prompt, str) else None


class LlamaCppTemplate:
    """`llama_cpp_template`: render with `/apply-template`, tokenize only what earlier requests did not render."""

    def __init__(self) -> None:
        self._rendered: BoundedCache[bytes, _Rendered] = BoundedCache(MAX_RENDERED)
        self._generation: BoundedCache[bytes, int] = BoundedCache(MAX_RENDERED // 64)

    async def __call__(self, fetch: Fetch, conversation: Conversation) -> int | None:
        """The prompt's tokens: the rendered messages plus the generation prompt."""
        body = {**conversation.fields, "messages": list(conversation.messages), "add_generation_prompt": False}
        rendered = _prompt(await fetch("POST", "/apply-template", body))
        if rendered is None:
            return None
        known, start = self._known_prefix(conversation, rendered)
        new = await self._tokens(fetch, rendered[start:], first=start == 0)
        generation = await self._generation_tokens(fetch, conversation, rendered)
        if new is None or generation is None:
            return None
        tokens = known + new
        if conversation.keys:
            digest = xxh3_128_digest(rendered.encode("utf-8", "surrogatepass"))
            self._rendered.put(conversation.scope + conversation.keys[-1], _Rendered(len(rendered), digest, tokens))
        return tokens + generation

    def _known_prefix(self, conversation: Conversation, rendered: str) -> tuple[int, int]:
        """Tokens and length of the longest remembered prefix `rendered` starts with (0, 0 when none)."""
        for key in reversed(conversation.keys[-LOOK_BACK - 1 : -1]):
            known = self._rendered.get(conversation.scope + key)
            if known is None:
                continue
            head = rendered[: known.length].encode("utf-8", "surrogatepass")
            if known.length <= len(rendered) and xxh3_128_digest(head) == known.digest:
                return known.tokens, known.length
            return 0, 0
        return 0, 0

    async def _generation_tokens(self, fetch: Fetch, conversation: Conversation, rendered: str) -> int | None:
        """Tokens the generation prompt adds, asked once per scope (model, template fields and tenant)."""
        known = self._generation.get(conversation.scope)
        if known is not None:
            return known
        body = {**conversation.fields, "messages": list(conversation.messages), "add_generation_prompt": True}
        primed = _prompt(await fetch("POST", "/apply-template", body))
        if primed is None or not primed.startswith(rendered):
            return None
        tokens = await self._tokens(fetch, primed[len(rendered) :], first=False)
        if tokens is not None:
            self._generation.put(conversation.scope, tokens)
        return tokens

    @staticmethod
    async def _tokens(fetch: Fetch, text: str, *, first: bool) -> int | None:
        """Tokens of `text` with the template's special tokens parsed; BOS and the like only at the very start."""
        if not text:
            return 0
        answer = await fetch("POST", "/tokenize", {"content": text, "add_special": first, "parse_special": True})
        tokens = answer.get("tokens") if isinstance(answer, Mapping) else None
        return len(tokens) if isinstance(tokens, list) else None


async def vllm_tokenize(fetch: Fetch, conversation: Conversation) -> int | None:
    """The whole conversation's `count` from vLLM, generation prompt included."""
    body = {
        **conversation.fields,
        "model": conversation.model,
        "messages": list(conversation.messages),
        "add_generation_prompt": True,
    }
    answer = await fetch("POST", "/tokenize", body)
    return _count(answer.get("count")) if isinstance(answer, Mapping) else None


def methods() -> dict[str, Method]:
    """Every counting method by the name `count_probes` uses (fresh, so each service keeps its own memory)."""
    return {"llama_cpp_template": LlamaCppTemplate(), "vllm_tokenize": vllm_tokenize}
