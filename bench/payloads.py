"""The chat-completion bodies the latency and memory figures send: tool-using agent conversations of a given size.

The conversations are `bench.resend.conversation` (a task, then pairs of a tool call and a ~400-token result), so
every figure in the table is about the same kind of traffic. Token counts are tiktoken's (the proxy's own counter).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.resend import conversation
from proxy.engine import TiktokenCounter

MODEL = "bench-model"
"""A model no window table knows: the proxy uses `--default-context-window` or the `X-Context-Window` header."""


@dataclass(frozen=True)
class Payload:
    """One request body written to a file for the load generator.

    :param name: The row label (`small`, `large`, `very large`).
    :param tokens: Message tokens of the conversation (tiktoken).
    :param path: The file holding the JSON body.
    :param size: The body's length in bytes.
    :param messages: How many messages it carries.
    """

    name: str
    tokens: int
    path: Path
    size: int
    messages: int

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
