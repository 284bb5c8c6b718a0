"""An upstream that answers chat completions instantly: the fixed point every latency figure is measured against.

It reads the whole request body (as any server must) but never parses it, and answers a canned chat completion (a
canned Messages API message on a path ending in `/messages`), so its own work is the same small constant for direct
and proxied requests. The prompt tokens in its usage are the body's length divided by `--bytes-per-token` (the bench
payloads' measured ratio), so the proxy anchors on plausible counts, including after it compacted a request.

Request headers steer it (the proxy forwards them untouched):

- `X-Bench-Stream: 1` answers Server-Sent Events (role, content, finish and usage chunks, then `[DONE]`);
- `X-Bench-Delay: SECONDS` waits that long after reading the body (a slow upstream, for the memory figures);
- `X-Bench-Events: N` streams N content events (default 1), `X-Bench-Pace: SECONDS` apart (default 0): an answer
  paced like a model's tokens, for the CPU per streamed event;
- `X-Bench-Usage-Null: 1` writes `"usage":null` in every streamed chunk but the usage chunk, as OpenAI does when the
  request asks `stream_options.include_usage` (which the proxy asks for when the client did not).

    python -m bench.instant_upstream --port 0 [--bytes-per-token 4.0]

prints its base URL (`http://127.0.0.1:PORT`) on stdout once it listens, and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

import orjson
from aiohttp import web

from bench.serving import serve_until_signalled

BYTES_PER_TOKEN = web.AppKey("bytes_per_token", float)

STREAM_HEADER = "X-Bench-Stream"
DELAY_HEADER = "X-Bench-Delay"
EVENTS_HEADER = "X-Bench-Events"
PACE_HEADER = "X-Bench-Pace"
USAGE_NULL_HEADER = "X-Bench-Usage-Null"
FRAMING_EVENTS = 4
"""Events of a streamed answer besides its content events: role, finish, usage and `[DONE]`."""

REPLY_TEXT = "ok"
COMPLETION_TOKENS = 1


def completion(prompt_tokens: int) -> bytes:
    """The canned non-streamed answer, with usage for `prompt_tokens`."""
    return orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "gpt-4.1",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": REPLY_TEXT},
                    "finish_reason": "stop",
                }
            ],
            "usage": _usage(prompt_tokens),
        }
    )


def message(input_tokens: int) -> bytes:
    """The canned Messages API answer, with usage for `input_tokens`."""
    return orjson.dumps(
        {
            "id": "msg_bench",
            "type": "message",
            "role": "assistant",
            "model": "bench-model",
            "content": [{"type": "text", "text": REPLY_TEXT}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": COMPLETION_TOKENS},
        }
    )


def _usage(prompt_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": COMPLETION_TOKENS,
        "total_tokens": prompt_tokens + COMPLETION_TOKENS,
    }


def stream_events(prompt_tokens: int, content_events: int = 1, *, usage_null: bool = False) -> list[bytes]:
    """The canned streamed answer as separate SSE events (each is written and flushed on its own).

    :param usage_null: Every chunk but the usage chunk says `"usage":null` (OpenAI's under `include_usage`).
    """
    head = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1_700_000_000, "model": "gpt-4.1"}
    tail = {"usage": None} if usage_null else {}
    content = {**head, "choices": [{"index": 0, "delta": {"content": REPLY_TEXT}, "finish_reason": None}], **tail}
    opening = [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
    chunks = [
        {**head, "choices": opening, **tail},
        *[content] * content_events,
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], **tail},
        {**head, "choices": [], "usage": _usage(prompt_tokens)},
    ]
    return [b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks] + [b"data: [DONE]\n\n"]


async def answer(request: web.Request) -> web.StreamResponse:
    """Read the body, optionally wait, and answer (JSON or SSE) without looking inside the body."""
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
    delay = request.headers.get(DELAY_HEADER)
    if delay:
        await asyncio.sleep(float(delay))
    prompt_tokens = max(1, int(size / request.app[BYTES_PER_TOKEN]))
    if request.path.endswith("/messages"):
        return web.Response(body=message(prompt_tokens), content_type="application/json")
    if request.headers.get(STREAM_HEADER) != "1":
        return web.Response(body=completion(prompt_tokens), content_type="application/json")
    pace = float(request.headers.get(PACE_HEADER, "0"))
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await out.prepare(request)
    usage_null = request.headers.get(USAGE_NULL_HEADER) == "1"
    for event in stream_events(prompt_tokens, int(request.headers.get(EVENTS_HEADER, "1")), usage_null=usage_null):
        await out.write(event)
        if pace:
            await asyncio.sleep(pace)
    await out.write_eof()
    return out


def make_app(bytes_per_token: float) -> web.Application:
    """The application: every method and path gets the canned answer."""
    app = web.Application(client_max_size=1 << 30, handler_args={"auto_decompress": False})
    app[BYTES_PER_TOKEN] = bytes_per_token
    app.router.add_route("*", "/{tail:.*}", answer)
    return app


async def serve(host: str, port: int, bytes_per_token: float) -> None:
    """Listen, print the base URL, and serve until SIGTERM/SIGINT."""
    await serve_until_signalled(make_app(bytes_per_token), host, port)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the flags and serve."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")
    parser.add_argument("--bytes-per-token", type=float, default=4.0, help="reported prompt_tokens = bytes / this")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.host, args.port, args.bytes_per_token))
    return 0


if __name__ == "__main__":
    sys.exit(main())
