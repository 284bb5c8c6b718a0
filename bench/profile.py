"""Where a small request's time goes: the proxy in this process under cProfile, loaded by `bench.loadgen`.

    python -m bench.profile [--concurrency 32] [--requests 6000] [--loop asyncio|uvloop] [--output FILE]
    python -m bench.profile --events 150 --concurrency 100 --requests 300    # streamed answers, paced

The instant upstream runs in a process of its own and the load generator in another (so neither is in the profile);
the proxy runs here, built and served as `proxy.cli serve` builds and serves it (its compaction side, its access log
written to a file as a deployed proxy writes it to its stderr, the collector's thresholds), with a window large
enough that nothing compacts. The profiler runs only while the measured requests do (after a warm-up), and the
text it writes has the functions sorted by cumulative time (what a call costs with everything under it) and by own
time (where the CPU actually is), with the CPU per request measured without the profiler first.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import logging
import pstats
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import redirect_stderr
from pathlib import Path

from aiohttp import web

from bench.fixed_cost import PACE
from bench.instant_upstream import EVENTS_HEADER, FRAMING_EVENTS, PACE_HEADER
from bench.payloads import build
from bench.processes import Server
from proxy.cli import build_compaction
from proxy.config import Settings
from proxy.server.app import create_app, runner_options
from proxy.server.event_loop import new_event_loop
from proxy.server.logging import configure_logging, flush_logging
from proxy.server.main import COLLECTOR_THRESHOLDS

OUTPUT = Path(__file__).parent / "results" / "profile.txt"
TOP = 45
"""Functions listed per ordering."""


def _warmup(concurrency: int, events: int) -> int:
    """Unmeasured requests before a load: none for streamed answers (each is thousands of events already)."""
    return 0 if events else concurrency * 4


async def _load(url: str, body: Path, concurrency: int, requests: int, events: int) -> dict[str, object]:
    """Run `bench.loadgen` against `url` in a child process; its JSON summary.

    :param events: Ask for streamed answers of this many content events, `PACE` seconds apart (0: not streamed).
    """
    streamed = ["--stream", "--header", f"{EVENTS_HEADER}={events}", "--header", f"{PACE_HEADER}={PACE}"]
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.loadgen",
        "--url",
        url,
        "--body",
        str(body),
        "--concurrency",
        str(concurrency),
        "--requests",
        str(requests),
        "--warmup",
        str(_warmup(concurrency, events)),
        "--max-seconds",
        "600",
        *(streamed if events else []),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await child.communicate()
    summary: dict[str, object] = json.loads(out.decode().strip().splitlines()[-1])
    return summary


async def _profiled(
    settings: Settings, body: Path, concurrency: int, requests: int, events: int
) -> tuple[str, dict[str, object]]:
    """Serve the proxy here; measure its CPU per request, then profile the same load; the profile's text."""
    app = create_app(settings, build_compaction(settings))
    runner = web.AppRunner(app, handle_signals=False, **runner_options(settings))
    await runner.setup()
    site = web.TCPSite(runner, settings.host, 0, backlog=1024)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/chat/completions"
    try:
        await _load(url, body, concurrency, concurrency * 8, events)
        cpu = time.process_time()
        plain = await _load(url, body, concurrency, requests, events)
        answers = int(str(plain["completed"])) + _warmup(concurrency, events)
        cpu_us = (time.process_time() - cpu) / (answers * (events + FRAMING_EVENTS if events else 1)) * 1e6
        profiler = cProfile.Profile()
        profiler.enable()
        await _load(url, body, concurrency, requests, events)
        profiler.disable()
    finally:
        await runner.cleanup()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text).strip_dirs()
    for order in ("cumulative", "tottime"):
        text.write(f"\n=== sorted by {order} ===\n")
        stats.sort_stats(order).print_stats(TOP)
    per = "cpu_us_per_event" if events else "cpu_us_per_request"
    return text.getvalue(), {"rps_unprofiled": plain["rps"], per: round(cpu_us, 1)}


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the flags, profile, write the text profile."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--events", type=int, default=0, help="streamed answers of this many paced content events")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="compaction-profile-") as temp:
        workdir = Path(temp)
        payload = build("small", 1_000, workdir)
        upstream_args = ["-m", "bench.instant_upstream", "--port", "0"]
        with Server("upstream", upstream_args, workdir) as upstream, (workdir / "proxy.log").open("w") as log:
            settings = Settings(upstream=upstream.url, host="127.0.0.1", port=0, default_context_window=4_000_000)
            with redirect_stderr(log):
                configure_logging(settings, deferred=True)
            gc.set_threshold(*COLLECTOR_THRESHOLDS)
            loop = new_event_loop(args.loop)
            try:
                text, figures = loop.run_until_complete(
                    _profiled(settings, payload.path, args.concurrency, args.requests, args.events)
                )
            finally:
                loop.close()
                flush_logging()  # the last lines into the log file while it is open (not at exit, after it closed)
                logging.getLogger().handlers.clear()
    head = f"python -m bench.profile --concurrency {args.concurrency} --requests {args.requests} --loop {args.loop}"
    head += f" --events {args.events}\n" if args.events else "\n"
    head += f"small request ({payload.size} B), without the profiler: {json.dumps(figures)}\n"
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(head + text)
    print(head + text[:6000])
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
