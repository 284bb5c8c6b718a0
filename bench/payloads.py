"""The request bodies the latency and memory figures send: tool-using agent conversations of a given size.

The conversations are `bench.resend.conversation` (a task, then pairs of a tool call and a ~400-token result), as
chat completions or, for the Messages API row, the same conversation in Anthropic's shape, so every figure in the
table is about the same kind of traffic. Token counts are tiktoken's (the proxy's own counter).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.resend import conversation
from proxy.engine import TiktokenCounter

MODEL = "bench-model"
"""A model no window table knows: the proxy uses `--default-context-window` or the `X-Context-Window` header."""
CHAT_PATH = "/v1/chat/completions"
MESSAGES_PATH = "/v1/messages"


@dataclass(frozen=True)
class Payload:
    """One request body written to a file for the load generator.

    :param name: The row label (`small`, `large`, `very large`).
    :param tokens: Message tokens of the conversation (tiktoken).
    :param path: The file holding the JSON body.
    :param size: The body's length in bytes.
    :param messages: How many messages it carries.
    :param route: The path it is sent to.
    """

    name: str
    tokens: int
    path: Path
    size: int
    messages: int
    route: str = CHAT_PATH

    @property
    def bytes_per_token(self) -> float:
        """Body bytes per message token."""
        return self.size / self.tokens


def build(name: str, tokens: int, directory: Path) -> Payload:
    """Write a body of about `tokens` message tokens to `directory` and describe it."""
    messages = conversation(tokens)
    counted = TiktokenCounter().messages_tokens(messages)
    body = orjson.dumps({"model": MODEL, "messages": messages})
    path = directory / f"{name.replace(' ', '_')}.json"
    path.write_bytes(body)
    return Payload(name=name, tokens=counted, path=path, size=len(body), messages=len(messages))


def build_messages(name: str, tokens: int, directory: Path) -> Payload:
    """Like `build`, as a Messages API body: the system prompt apart, each tool call a `tool_use` block answered by a
    `tool_result` block in the next user message. `tokens` is the chat conversation's count."""
    chat = conversation(tokens)
    messages: list[dict[str, Any]] = [{"role": "user", "content": chat[1]["content"]}]
    for call, result in zip(chat[2::2], chat[3::2], strict=True):
        function = call["tool_calls"][0]["function"]
        use = {"type": "tool_use", "id": f"toolu_{result['tool_call_id']}", "name": function["name"]}
        messages.append({"role": "assistant", "content": [{**use, "input": orjson.loads(function["arguments"])}]})
        answer = {"type": "tool_result", "tool_use_id": use["id"], "content": result["content"]}
        messages.append({"role": "user", "content": [answer]})
    document = {"model": MODEL, "max_tokens": 1024, "system": chat[0]["content"], "messages": messages}
    body = orjson.dumps(document)
    path = directory / f"{name.replace(' ', '_').replace(',', '')}.json"
    path.write_bytes(body)
    counted = TiktokenCounter().messages_tokens(chat)
    return Payload(name, counted, path, len(body), len(messages), MESSAGES_PATH)
