"""Loopback upstreams that count prompts like llama.cpp's or vLLM's server, with a tokenizer that is not tiktoken.

`CountingUpstream` renders messages with a ChatML template that, like SmolLM2's, inserts a default system prompt when
the conversation does not start with one (so a message's count depends on what precedes it), tokenizes with
`fake_tokens` (about 1.6 times tiktoken on English), and answers:

- like llama.cpp (`kind="llama.cpp"`): `POST /apply-template` (`add_generation_prompt`) and `POST /tokenize`
  (`content`, `add_special`, `parse_special`);
- like vLLM (`kind="vllm"`): `POST /tokenize` with `messages`, answering `count`, `max_model_len` and `tokens`;
- like neither (`kind="none"`): 404 on both;

and chat completions whose `usage.prompt_tokens` is the same count, so the proxy's estimate can be compared with
what the server reports. `hold` makes the counting endpoints wait until it is set (a slow server), `lie` makes them
answer that many tokens whatever the prompt, and `api_keys` refuses every request without one of them as its bearer
token, with llama.cpp's 401 (its `--api-key`). Every request is recorded.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp import web
from aiohttp.test_utils import TestServer

DEFAULT_SYSTEM = "You are a helpful assistant built for testing token counts."
_TOKEN = re.compile(r"<\|\w+\|>|\w+|[^\w\s]|\n")


def fake_tokens(text: str) -> int:
    """Tokens of `text`: one per special token, punctuation mark and newline, one per 2.5 letters of a word."""
    return sum(1 if not piece[0].isalnum() else math.ceil(len(piece) / 2.5) for piece in _TOKEN.findall(text))


def render(messages: Sequence[Mapping[str, Any]], *, generation: bool) -> str:
    """The ChatML prompt of `messages` (a default system prompt first unless there is one), and the reply's start."""
    shown = list(messages)
    if not shown or shown[0].get("role") != "system":
        shown.insert(0, {"role": "system", "content": DEFAULT_SYSTEM})
    text = "".join(f"<|im_start|>{m.get('role')}\n{m.get('content') or ''}<|im_end|>\n" for m in shown)
    return text + ("<|im_start|>assistant\n" if generation else "")


@dataclass(frozen=True)
class Seen:
    """One request the upstream received."""

    path: str
    json: Any
    headers: dict[str, str]


@dataclass
class CountingUpstream:
    """A loopback upstream that counts like `kind` (see the module docs); use as an async context manager."""

    kind: str = "llama.cpp"
    hold: asyncio.Event | None = None
    lie: int | None = None
    api_keys: frozenset[str] | None = None
    seen: list[Seen] = field(default_factory=list)
    _server: TestServer | None = None

    @property
    def url(self) -> str:
        """The upstream's origin."""
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.port}"

    def counted(self) -> list[Seen]:
        """The counting requests received (everything but chat completions)."""
        return [seen for seen in self.seen if seen.path != "/v1/chat/completions"]

    async def __aenter__(self) -> Self:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/{tail:.*}", self._handle)
        self._server = TestServer(app, host="127.0.0.1", port=0)
        await self._server.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        await self._server.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append(Seen(request.path, body, dict(request.headers)))
        if self.api_keys is not None and request.headers.get("Authorization", "")[7:] not in self.api_keys:
            error = {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}
            return web.json_response({"error": error}, status=401)
        if request.path == "/v1/chat/completions":
            return web.json_response(_completion(body))
        if (self.kind, request.path) not in ROUTES:
            return web.json_response({"error": "not found"}, status=404)
        if self.hold is not None:
            await self.hold.wait()
        return web.json_response(counting_answer(self.kind, request.path, body, self.lie))


ROUTES = {("llama.cpp", "/apply-template"), ("llama.cpp", "/tokenize"), ("vllm", "/tokenize")}
"""The counting endpoints each kind of server answers."""


def counting_answer(kind: str, path: str, body: Mapping[str, Any], lie: int | None = None) -> dict[str, Any]:
    """What a server of `kind` answers to a counting request on one of its `ROUTES` (`lie`: that many tokens)."""
    if path == "/apply-template":
        return {"prompt": render(body["messages"], generation=body.get("add_generation_prompt", True))}
    if kind == "llama.cpp":
        return {"tokens": list(range(lie if lie is not None else fake_tokens(body["content"])))}
    count = lie if lie is not None else fake_tokens(render(body["messages"], generation=True))
    return {"count": count, "max_model_len": 8192, "tokens": [], "token_strs": None}


def _completion(body: Mapping[str, Any]) -> dict[str, Any]:
    prompt = fake_tokens(render(body["messages"], generation=True))
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": body.get("model"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Ok."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 2, "total_tokens": prompt + 2},
    }
