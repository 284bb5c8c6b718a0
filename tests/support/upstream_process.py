"""The simulated OpenAI upstream as its own process, with the knobs benchmarks and load tests turn.

    python -m tests.support.upstream_process --port 0 --context-window 8192 --stream-digests

prints the base URL on stdout once it is listening, and serves until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

from proxy.simulator.openai_upstream import DEFAULT_CONTEXT_WINDOW, OpenAIUpstream, tool_loop_responder
from proxy.simulator.responses_api import responses_tool_loop_responder
from proxy.simulator.serving import serve_until_signalled


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.upstream_process", description="Serve the fake OpenAI upstream until stopped."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")
    parser.add_argument("--context-window", type=int, default=DEFAULT_CONTEXT_WINDOW)
    parser.add_argument(
        "--model-window", action="append", default=[], metavar="MODEL=TOKENS", help="per-model window (repeatable)"
    )
    parser.add_argument(
        "--tool-loop",
        metavar="TOOL",
        help="answer with tool_loop_responder(TOOL, --steps), and responses_tool_loop_responder on /v1/responses",
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--stream-chunk-delay", type=float, default=0.0, help="seconds between SSE chunks")
    parser.add_argument("--stream-digests", action="store_true", help="add X-Stream-Sha256 headers to streams")
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    windows = {model: int(tokens) for model, tokens in (item.split("=", 1) for item in args.model_window)}
    responder = tool_loop_responder(args.tool_loop, args.steps, parallel=args.parallel) if args.tool_loop else None
    responses_responder = (
        responses_tool_loop_responder(args.tool_loop, args.steps, parallel=args.parallel) if args.tool_loop else None
    )
    upstream = OpenAIUpstream(
        responder,
        context_window=args.context_window,
        context_windows=windows,
        host=args.host,
        port=args.port,
        stream_chunk_delay=args.stream_chunk_delay,
        stream_digests=args.stream_digests,
        responses_responder=responses_responder,
    )
    await serve_until_signalled(upstream, lambda base_url: print(base_url, flush=True))


def main(argv: Sequence[str] | None = None) -> None:
    """Serve until SIGINT or SIGTERM, after printing the base URL on stdout."""
    asyncio.run(_serve(_parse_args(argv)))


if __name__ == "__main__":
    main()
