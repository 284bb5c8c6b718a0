"""An upstream that answers every chat completion with one fixed reply, without parsing what it receives.

For the stall and memory tests: the request bodies there are many megabytes, and `OpenAIUpstream` would tokenize
each one on the test's own event loop, which would both slow the suite and distort latencies measured from that
loop. This server only reads the body (so the proxy's upload completes) and counts what arrived.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

from aiohttp import web

from proxy.simulator.loopback_server import LoopbackServer

REPLY: Final = "fixed upstream reply"
"""The assistant's content in every answer: a test asserts it to know the upstream's answer reached the client."""

_COMPLETION: Final[dict[str, Any]] = {
    "id": "chatcmpl-fixed",
    "object": "chat.completion",
    "created": 1_715_367_049,
    "model": "fixed",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": REPLY, "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
}


_MESSAGE: Final[dict[str, Any]] = {
    "id": "msg_fixed",
    "type": "message",
    "role": "assistant",
    "model": "fixed",
    "content": [{"type": "text", "text": REPLY}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 3},
}


class FixedUpstream(LoopbackServer):
    """`POST /v1/chat/completions` answers `_COMPLETION` (200) after reading the whole body, `POST /v1/messages` the
    Messages API's `_MESSAGE`; on 127.0.0.1.

    Observations: `requests` (chat completions answered) and `received_bytes` (their body bytes, in total).
    """

    def __init__(self) -> None:
        self.requests = 0
        self.received_bytes = 0

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=1024**3)
        app.router.add_post("/v1/chat/completions", self._answer(_COMPLETION))
        app.router.add_post("/v1/messages", self._answer(_MESSAGE))
        return app

    def _answer(self, answer: dict[str, Any]) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def read_and_answer(request: web.Request) -> web.Response:
            size = 0
            while chunk := await request.content.readany():
                size += len(chunk)
            self.requests += 1
            self.received_bytes += size
            return web.json_response(answer)

        return read_and_answer
