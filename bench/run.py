"""The benchmark: every figure docs/benchmarks.md quotes, measured in one run on one machine, as markdown tables.

    python -m bench [--quick] [--output bench/results/bench.json]

Processes (all on 127.0.0.1, ports picked by the OS, all stopped at the end whatever happens):

- `bench.instant_upstream`: answers every chat completion at once without parsing it (the fixed point);
- `bench.bare_relay`: the floor, an aiohttp relay with no parsing, in front of the same upstream;
- `proxy.cli serve`: the proxy, as deployed, in front of the same upstream, with a window large enough that nothing
  compacts (`X-Context-Window` on the "compacting" rows makes every request compact, then replay its rewrite);
- LiteLLM's proxy, when installed in a virtual environment of its own (`bench.litellm_peer`);
- `bench.loadgen`: the load generator, one process per measured cell. Each cell runs three rounds over the targets in
  rotated order and reports medians (LiteLLM, ten times slower, one round). The small conversation is sent once more
  to `POST /v1/messages`, in the Messages API's shape, direct, through the relay and through the proxy.

Then the fixed cost (`bench.fixed_cost`): the proxy's requests per second against the relay's with 32 clients and with
one, and its CPU per streamed event against the relay's, the two on the same event loop (asyncio's, and uvloop's when
installed). Then: a 400k-token conversation re-sent over sockets through the proxy and the relay
(`bench.resend_wire`), resident memory per in-flight very large request (fresh processes, slow upstream), a long
tool-using run with rewrite memory on and off (`bench.long_run`), the re-sent conversation's decision alone
(`bench.resend`) and our hook against Haystack's (`bench.hook_vs_haystack`), each in its own process; and what each
chain keeps of realistic agent transcripts (`bench.retention`, no sockets).

`--quick` runs a few seconds' worth of everything (CI smoke test): its figures are not worth quoting.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench import fixed_cost, litellm_peer, long_run, memory, retention
from bench.latency import Load, Target, run_cell, write_progress
from bench.payloads import Payload, build, build_messages
from bench.processes import ROOT, Server
from bench.report import render

RESULTS = Path(__file__).parent / "results" / "bench.json"
LITELLM = "LiteLLM"
MESSAGES_API = "Messages API, small"
"""The row of the same small conversation sent to `POST /v1/messages`."""
MESSAGES_TARGETS = (("direct", "upstream"), ("bare relay", "relay"), ("proxy", "proxy"))
NO_COMPACTION_WINDOW = 4_000_000
"""`--default-context-window` of the proxy: no payload comes near 70% of it."""


@dataclass(frozen=True)
class Plan:
    """How big the run is."""

    sizes: dict[str, int]
    concurrencies: list[int]
    requests: dict[str, dict[int, int]]
    max_seconds: float
    rounds: int
    memory_in_flight: list[int]
    memory_delay_seconds: float
    long_run_tasks: int
    long_run_steps: int
    resend_tokens: int
    resend_repeat: int
    resend_turns: int
    hook_args: list[str]
    retention: tuple[list[int], int]
    fixed_cost: fixed_cost.Sizes


FULL = Plan(
    sizes={"small": 1_000, "large": 100_000, "very large": 400_000},
    concurrencies=[1, 64, 256],
    requests={
        "small": {1: 3000, 64: 6000, 256: 6000},
        "large": {1: 300, 64: 640, 256: 768},
        "very large": {1: 60, 64: 192, 256: 256},
    },
    max_seconds=10.0,
    rounds=3,
    memory_in_flight=[1, 8, 32],
    memory_delay_seconds=3.0,
    long_run_tasks=10,
    long_run_steps=20,
    resend_tokens=400_000,
    resend_repeat=3,
    resend_turns=40,
    hook_args=[],
    retention=(list(retention.SEEDS), retention.WINDOW),
    fixed_cost=fixed_cost.FULL,
)

QUICK = Plan(
    sizes={"small": 1_000, "very large": 20_000},
    concurrencies=[4],
    requests={"small": {1: 20, 4: 40}, "very large": {1: 5, 4: 8}},
    max_seconds=1.0,
    rounds=1,
    memory_in_flight=[2],
    memory_delay_seconds=0.3,
    long_run_tasks=1,
    long_run_steps=3,
    resend_tokens=20_000,
    resend_repeat=1,
    resend_turns=3,
    hook_args=["--smoke"],
    retention=retention.SMOKE,
    fixed_cost=fixed_cost.QUICK,
)


@contextmanager
def servers(workdir: Path, bytes_per_token: float, *, litellm: Path | None = None) -> Iterator[dict[str, Server]]:
    """The instant upstream, the bare relay, the proxy and (when `litellm` is given) LiteLLM; stopped on exit."""
    with ExitStack() as stack:
        upstream = stack.enter_context(
            Server(
                "upstream",
                ["-m", "bench.instant_upstream", "--port", "0", "--bytes-per-token", f"{bytes_per_token:.3f}"],
                workdir,
            )
        )
        relay = stack.enter_context(
            Server("bare-relay", ["-m", "bench.bare_relay", "--port", "0", "--upstream", upstream.url], workdir)
        )
        proxy = stack.enter_context(start_proxy(workdir, upstream.url, "proxy"))
        procs = {"upstream": upstream, "relay": relay, "proxy": proxy}
        if litellm is not None:
            procs["litellm"] = stack.enter_context(litellm_peer.start_litellm(litellm, workdir, upstream.url))
        yield procs


def start_proxy(workdir: Path, upstream: str, name: str) -> Server:
    """A proxy process (not yet started) in front of `upstream`, with a window that never compacts."""
    args = ["-m", "proxy.cli", "serve", "--host", "127.0.0.1", "--port", "0", "--upstream", upstream]
    args += ["--default-context-window", str(NO_COMPACTION_WINDOW)]
    return Server(name, args, workdir, url_on_stderr=True)


def latency_rows(plan: Plan, payloads: dict[str, Payload], procs: dict[str, Server], log: Path) -> list[dict[str, Any]]:
    """Every latency cell: direct, bare relay, proxy, proxy compacting and LiteLLM (when running), for each size and
    concurrency; the streamed rows without LiteLLM (the instant upstream streams on a header LiteLLM does not pass)."""
    results: list[dict[str, Any]] = []
    for name, payload in payloads.items():
        compact_window = int(payload.tokens / 0.75)
        targets = [
            Target("direct", procs["upstream"].url),
            Target("bare relay", procs["relay"].url),
            Target("proxy", procs["proxy"].url),
            Target("proxy, compacting", procs["proxy"].url, {"X-Context-Window": str(compact_window)}),
        ]
        if "litellm" in procs:
            targets.append(Target(LITELLM, procs["litellm"].url, procs["litellm"].client_headers))
        for concurrency in plan.concurrencies:
            count = plan.requests[name][concurrency]
            load = Load(concurrency, count, warmup=max(concurrency, min(50, count // 10)), max_seconds=plan.max_seconds)
            write_progress(f"latency: {name} ({payload.size} B), concurrency {concurrency}, {count} requests", log)
            results += run_cell(targets, payload, load, plan.rounds, once=frozenset({LITELLM}))
        if name != "very large":
            load = Load(1, plan.requests[name][1], warmup=10, max_seconds=plan.max_seconds, stream=True)
            write_progress(f"latency: {name}, streamed, sequential", log)
            results += run_cell(targets[:3], payload, load, plan.rounds)
    return results


def messages_rows(plan: Plan, procs: dict[str, Server], workdir: Path, log: Path) -> list[dict[str, Any]]:
    """The Messages API's sequential cell: the small conversation, direct, through the bare relay and through the
    proxy, as the chat rows measure them."""
    payload = build_messages(MESSAGES_API, plan.sizes["small"], workdir)
    headers = {"anthropic-version": "2023-06-01"}
    targets = [Target(name, procs[key].url, headers) for name, key in MESSAGES_TARGETS]
    count = plan.requests["small"][1]
    write_progress(f"latency: {payload.name} ({payload.size} B), sequential, {count} requests", log)
    load = Load(1, count, warmup=min(50, count // 10), max_seconds=plan.max_seconds)
    return run_cell(targets, payload, load, plan.rounds)


def socket_rows(
    plan: Plan, payloads: dict[str, Payload], procs: dict[str, Server], workdir: Path, log: Path
) -> dict[str, Any]:
    """The latency cells and their summary (`latency_cells`, `latency`), and the fixed cost (`fixed_cost`)."""
    cells = latency_rows(plan, payloads, procs, log) + messages_rows(plan, procs, workdir, log)
    return {
        "latency_cells": cells,
        "latency": summarize_latency(cells),
        "fixed_cost": fixed_cost.run(plan.fixed_cost, payloads["small"], workdir, log),
    }


def summarize_latency(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (payload, concurrency, streamed) with direct, relay, proxy and compacting figures side by side."""
    groups: dict[tuple[str, int, bool], dict[str, dict[str, Any]]] = {}
    for cell in cells:
        groups.setdefault((cell["payload"], cell["concurrency"], cell["stream"]), {})[cell["target"]] = cell
    rows = []
    for (payload, concurrency, stream), by_target in groups.items():
        direct, relay, proxy = by_target["direct"], by_target["bare relay"], by_target["proxy"]
        compacting = by_target.get("proxy, compacting")
        key = "ttfb_" if stream else ""
        row = {
            "payload": payload,
            "body_bytes": direct["body_bytes"],
            "concurrency": concurrency,
            "stream": stream,
            "direct_p50_ms": direct[f"{key}p50_ms"],
            "direct_p99_ms": direct[f"{key}p99_ms"],
            "relay_added_p50_ms": relay[f"{key}p50_ms"] - direct[f"{key}p50_ms"],
            "relay_added_p99_ms": relay[f"{key}p99_ms"] - direct[f"{key}p99_ms"],
            "proxy_added_p50_ms": proxy[f"{key}p50_ms"] - direct[f"{key}p50_ms"],
            "proxy_added_p99_ms": proxy[f"{key}p99_ms"] - direct[f"{key}p99_ms"],
            "direct_rps": direct["rps"],
            "relay_rps": relay["rps"],
            "proxy_rps": proxy["rps"],
            "proxy_vs_relay_p50": proxy[f"{key}p50_ms"] / relay[f"{key}p50_ms"] if relay[f"{key}p50_ms"] else 0.0,
            "relay_vs_proxy_rps": relay["rps"] / proxy["rps"] if proxy["rps"] else 0.0,
            "proxy_vs_relay_rps": proxy["rps"] / relay["rps"] if relay["rps"] else 0.0,
            "problems": [cell["problem"] for cell in by_target.values() if "problem" in cell],
        }
        if compacting is not None:
            row["compacting_added_p50_ms"] = compacting["p50_ms"] - direct["p50_ms"]
            row["compacting_added_p99_ms"] = compacting["p99_ms"] - direct["p99_ms"]
            row["compacting_rps"] = compacting["rps"]
            row["compacting_decisions"] = compacting["x_compaction"]
        if (litellm := by_target.get(LITELLM)) is not None:
            row["litellm_p50_ms"] = litellm["p50_ms"]
            row["litellm_rps"] = litellm["rps"]
            row["proxy_vs_litellm_rps"] = proxy["rps"] / litellm["rps"] if litellm["rps"] else float("inf")
        rows.append(row)
    return rows


def run_module(args: list[str], timeout: float) -> str:
    """Run `python <args>` from the repository root; return its stdout (raise with its stderr if it fails)."""
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr[-3000:]}")
    return done.stdout


def resend(plan: Plan) -> dict[str, Any]:
    """`bench.resend` in its own process: cold decision vs the same conversation re-sent with two new messages."""
    out = run_module(
        ["-m", "bench.resend", "--tokens", str(plan.resend_tokens), "--repeat", str(plan.resend_repeat)], 900
    )
    figures: dict[str, Any] = json.loads(out[out.index("{") :])
    return figures


def resend_wire(plan: Plan, procs: dict[str, Server]) -> dict[str, Any]:
    """`bench.resend_wire` against the running relay and proxy, `plan.rounds` times: the round of the median ratio.

    One round is a few dozen requests, so a noisy neighbour on the shared machine moves it a lot; every round's ratio
    is kept (`ratios`) beside the median one's figures.
    """
    args = ["-m", "bench.resend_wire", "--relay", procs["relay"].url, "--proxy", procs["proxy"].url]
    args += ["--tokens", str(plan.resend_tokens), "--turns", str(plan.resend_turns)]
    rounds: list[dict[str, Any]] = [json.loads(run_module(args, 900)) for _ in range(plan.rounds)]
    rounds.sort(key=lambda figures: figures["proxy_vs_relay"])
    return {**rounds[len(rounds) // 2], "ratios": [figures["proxy_vs_relay"] for figures in rounds]}


def hook_vs_haystack(plan: Plan, workdir: Path) -> dict[str, Any]:
    """`bench.hook_vs_haystack` in its own process; its JSON results."""
    output = workdir / "hook_vs_haystack.json"
    run_module(["-m", "bench.hook_vs_haystack", *plan.hook_args, "--output", str(output)], 1800)
    figures: dict[str, Any] = json.loads(output.read_text())
    return figures


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
    }


def main(argv: list[str] | None = None) -> int:
    """Run everything, print the markdown table, write the JSON results."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few seconds of everything (CI smoke run)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="JSON results file (default %(default)s)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    started = time.perf_counter()
    results: dict[str, Any] = {
        "command": "python -m bench" + (" --quick" if args.quick else ""),
        "machine": machine(),
        "plan": asdict(plan),
    }
    with tempfile.TemporaryDirectory(prefix="compaction-bench-") as temp:
        workdir = Path(temp)
        log = workdir / "progress.log"
        write_progress("building payloads", log)
        payloads = {name: build(name, tokens, workdir) for name, tokens in plan.sizes.items()}
        results["payloads"] = {
            name: {"tokens": p.tokens, "bytes": p.size, "messages": p.messages} for name, p in payloads.items()
        }
        bytes_per_token = payloads[max(payloads, key=lambda n: payloads[n].tokens)].bytes_per_token
        litellm = litellm_peer.command()
        results["litellm"] = None if litellm is None else str(litellm)
        if litellm is None:
            results["litellm_note"] = litellm_peer.absent_note()
            write_progress(results["litellm_note"], log)
        with servers(workdir, bytes_per_token, litellm=litellm) as procs:
            results["idle_rss_mib"] = {name: server.rss_kib() / 1024 for name, server in procs.items()}
            results |= socket_rows(plan, payloads, procs, workdir, log)
            write_progress("re-sent conversation through the proxy and the relay", log)
            results["resend_wire"] = resend_wire(plan, procs)
            upstream_url = procs["upstream"].url
            write_progress("memory", log)
            very_large = payloads["very large"]
            rows = []
            relay_args = ["-m", "bench.bare_relay", "--port", "0", "--upstream", upstream_url]
            processes = {
                "proxy": lambda: start_proxy(workdir, upstream_url, "proxy-memory"),
                "bare relay": lambda: Server("relay-memory", relay_args, workdir),
            }
            for in_flight in plan.memory_in_flight:
                for relay, resent in (("proxy", True), ("proxy", False), ("bare relay", False)):
                    measuring = partial(
                        memory.measure,
                        relay,
                        processes[relay],
                        very_large,
                        payloads["small"],
                        in_flight=in_flight,
                        delay_seconds=plan.memory_delay_seconds,
                        resent=resent,
                    )
                    rows.append(memory.median_row(plan.rounds, measuring))
            results["memory"] = memory.as_dicts(rows)
        write_progress("long tool-using run, rewrite memory on and off", log)
        results["long_run"] = long_run.run(plan.long_run_tasks, plan.long_run_steps, workdir)
        write_progress("bench.resend", log)
        results["resend"] = resend(plan)
        write_progress("bench.hook_vs_haystack", log)
        results["hook_vs_haystack"] = hook_vs_haystack(plan, workdir)
        write_progress("bench.retention", log)
        results["retention"] = retention.run(*plan.retention)
    results["seconds"] = time.perf_counter() - started
    report = render(results)
    print(report)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
