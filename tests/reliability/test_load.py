"""Load: 1,000 concurrent streaming chat completions through one proxy process, with the upstream in another.

Every stream must arrive complete and byte-identical to what the upstream sent. The fake upstream (run with
`--stream-digests`) puts the SHA-256 of the stream it sends in `X-Stream-Sha256`, and of the same completion without
`include_usage` in `X-Stream-Sha256-Without-Usage`. A client that asked for usage itself gets the upstream's bytes
untouched; a client that did not gets the stream as the upstream would have sent it without `include_usage` (the
proxy asks for usage to anchor its estimates and strips the usage chunk and the `"usage": null` fields again: the
documented usage-chunk handling). No errors, and the proxy's memory stays bounded: RSS before, peak (VmHWM) and
after, read from /proc, with a second round to show that nothing accumulates.

Bounded in count (ROUNDS x STREAMS requests) and in time (every wait has a deadline); the figures are printed, for the
reliability page (docs/reliability.md). Deselect with `-m "not load"`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

pytestmark = pytest.mark.load

STREAMS = 1000
ROUNDS = 2
API_KEY = "sk-load-7d1f0c2e9a4b4e55a1c3"
SNIPPET = "Summarize the incident report for ticket"
CHUNK_DELAY = 0.25
"""Seconds between SSE events at the upstream: each stream lasts ~2 s, so all of a round's streams overlap."""


@dataclass
class Process:
    """A child process with its stderr in a file."""

    popen: subprocess.Popen[bytes]
    stderr: Path

    def rss_kib(self) -> tuple[int, int]:
        """(VmRSS, VmHWM) of the process in KiB: current and peak resident memory."""
        status = Path(f"/proc/{self.popen.pid}/status").read_text()
        values = {line.split(":")[0]: int(line.split()[1]) for line in status.splitlines() if line.startswith("Vm")}
        return values["VmRSS"], values["VmHWM"]

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)


def _wait_for_line(path: Path, pattern: re.Pattern[str], popen: subprocess.Popen[bytes], within: float) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        match = pattern.search(text)
        if match:
            return match.group(1)
        if popen.poll() is not None:
            raise AssertionError(f"process exited early: {text[-2000:]}")
        time.sleep(0.05)
    raise AssertionError(f"no {pattern.pattern!r} within {within} s")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Process, Process]]:
    """The upstream and the proxy, each its own process on loopback; yields (proxy URL, proxy, upstream)."""
    directory = tmp_path_factory.mktemp("load")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    started: list[Process] = []
    try:
        upstream_out = directory / "upstream.out"
        with upstream_out.open("wb") as out, (directory / "upstream.err").open("wb") as err:
            popen = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.support.upstream_process",
                    "--port",
                    "0",
                    "--stream-digests",
                    "--stream-chunk-delay",
                    str(CHUNK_DELAY),
                ],
                stdout=out,
                stderr=err,
                env=env,
            )
        upstream = Process(popen, directory / "upstream.err")
        started.append(upstream)
        upstream_url = _wait_for_line(upstream_out, re.compile(r"(http://\S+)"), popen, 30)

        proxy_env = {
            **env,
            "COMPACTION_PROXY_UPSTREAM": upstream_url,
            "COMPACTION_PROXY_HOST": "127.0.0.1",
            "COMPACTION_PROXY_PORT": "0",
            "COMPACTION_PROXY_LOG_FORMAT": "json",
            "COMPACTION_PROXY_LOG_LEVEL": "info",
        }
        proxy_err = directory / "proxy.err"
        with proxy_err.open("wb") as err:
            popen = subprocess.Popen(
                [sys.executable, "-m", "proxy.cli", "serve"], stdout=subprocess.DEVNULL, stderr=err, env=proxy_env
            )
        proxy = Process(popen, proxy_err)
        started.append(proxy)
        address = _wait_for_line(proxy_err, re.compile(r'"addresses":\["([^"]+)"'), popen, 30)
        yield f"http://{address}", proxy, upstream
    finally:
        for process in reversed(started):
            process.stop()


@dataclass
class Round:
    """What one round of concurrent streams saw."""

    streams: int = 0
    complete: int = 0
    identical: int = 0
    errors: list[str] = field(default_factory=list)
    peak_in_flight: float = 0.0
    seconds: float = 0.0


def _request(index: int, wants_usage: bool) -> bytes:
    body: dict[str, object] = {
        "model": "gpt-4o-mini",
        "stream": True,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": f"{SNIPPET} {index}: the queue backed up after the deploy."},
        ],
    }
    if wants_usage:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


async def _one_stream(http: aiohttp.ClientSession, url: str, index: int, result: Round) -> None:
    wants_usage = index % 2 == 0
    headers = {"Authorization": f"Bearer {API_KEY}", "X-Conversation-Id": f"load-{index}"}
    try:
        async with http.post(url + "/v1/chat/completions", data=_request(index, wants_usage), headers=headers) as r:
            body = await r.read()
            if r.status != 200:
                result.errors.append(f"status {r.status}: {body[:200]!r}")
                return
            expected = r.headers["X-Stream-Sha256" if wants_usage else "X-Stream-Sha256-Without-Usage"]
    except (aiohttp.ClientError, TimeoutError) as exc:
        result.errors.append(f"{type(exc).__name__}: {exc}")
        return
    if body.endswith(b"data: [DONE]\n\n"):
        result.complete += 1
    if hashlib.sha256(body).hexdigest() == expected:
        result.identical += 1
    else:
        result.errors.append(f"stream {index} differs from the upstream's")


async def _in_flight(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(url + "/metrics") as response:
        text = await response.text()
    match = re.search(r"^compaction_proxy_in_flight_requests (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def _round(url: str) -> Round:
    result = Round(streams=STREAMS)
    timeout = aiohttp.ClientTimeout(total=45)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http, aiohttp.ClientSession() as probe:
        started = time.perf_counter()
        tasks = [asyncio.create_task(_one_stream(http, url, index, result)) for index in range(STREAMS)]
        pending = set(tasks)
        while pending:
            _done, pending = await asyncio.wait(pending, timeout=0.1)
            result.peak_in_flight = max(result.peak_in_flight, await _in_flight(probe, url) - 1)  # minus this probe
        result.seconds = time.perf_counter() - started
    return result


def test_1000_concurrent_streams_arrive_whole_and_identical(servers: tuple[str, Process, Process]) -> None:
    url, proxy, _upstream = servers
    # Warm up (imports, tokenizer tables, connection pool) so "before" is the proxy's steady state.
    warm = asyncio.run(_warm_up(url))
    assert warm == 20
    rss_before, _ = proxy.rss_kib()
    rounds: list[Round] = []
    after: list[int] = []
    for _ in range(ROUNDS):
        rounds.append(asyncio.run(_round(url)))
        after.append(proxy.rss_kib()[0])
    _, rss_peak = proxy.rss_kib()
    figures = {
        "streams": sum(r.streams for r in rounds),
        "complete": sum(r.complete for r in rounds),
        "identical": sum(r.identical for r in rounds),
        "errors": sum(len(r.errors) for r in rounds),
        "peak_concurrent_streams": max(r.peak_in_flight for r in rounds),
        "round_seconds": [round(r.seconds, 1) for r in rounds],
        "rss_before_mib": round(rss_before / 1024, 1),
        "rss_peak_mib": round(rss_peak / 1024, 1),
        "rss_after_each_round_mib": [round(value / 1024, 1) for value in after],
    }
    print("\nLOAD FIGURES", json.dumps(figures))
    for r in rounds:
        assert r.errors == [], r.errors[:5]
        assert r.complete == r.identical == STREAMS
        assert r.peak_in_flight >= 0.8 * STREAMS  # they really were concurrent
    assert rss_peak - rss_before < 256 * 1024  # KiB: 1,000 open streams cost well under 256 MiB
    assert after[-1] - after[0] < 32 * 1024  # a second round leaves no more behind than the first: nothing leaks
    # The proxy's logs of the whole run carry neither the credential nor any message text.
    logs = proxy.stderr.read_text(errors="replace")
    assert logs.count('"route":"chat_completions"') >= ROUNDS * STREAMS
    assert API_KEY not in logs
    assert SNIPPET not in logs


async def _warm_up(url: str) -> int:
    result = Round()
    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(_one_stream(http, url, 10_000 + index, result) for index in range(20)))
    assert result.errors == []
    return result.identical
