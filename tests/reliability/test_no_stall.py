"""No single request freezes the proxy: `/healthz` keeps answering while huge requests are in flight.

Issue 14: a chat completion of 200,000 one-word messages held the event loop for 27 s (the token counter's cache
eviction was quadratic once full), and large bodies were parsed, hashed and counted on the event loop (four 60 MB
bodies at once: 16 s). The proxy runs in its own process here, so its event loop is not the test's; the upstream
answers without parsing, so the only work measured is the proxy's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable

import aiohttp

from tests.reliability.conftest import MODEL
from tests.reliability.fixed_upstream import REPLY, FixedUpstream
from tests.support import process_proxy
from tests.support.process_proxy import ProcessProxy, StartProcessProxy
from tests.support.stalls import ControlServer, HealthProbe, assert_no_stall

start_process_proxy = process_proxy.start_process_proxy

UPLOAD_PIECE = 1024 * 1024

FIRST_REQUEST_FACTOR = 4
"""How many times the next request's time the first may take: connecting and first-use caches, never a load."""

IN_FLIGHT_LIMIT = 120.0
"""Seconds the big requests may take in all: a guard against a hang, not a performance bound."""


async def poll_healthz(
    http: aiohttp.ClientSession, proxy: ProcessProxy, stop: asyncio.Event, polls: list[float]
) -> None:
    """Round-trip `/healthz` back to back until `stop` is set, appending each round trip's seconds to `polls`."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        started = loop.time()
        async with http.get(proxy.url + "/healthz") as response:
            assert response.status == 200
            await response.read()
        polls.append(loop.time() - started)


async def idle_wait(http: aiohttp.ClientSession, proxy: ProcessProxy, probes: int = 30) -> float:
    """The slowest of `probes` `/healthz` round trips with nothing in flight."""
    loop = asyncio.get_running_loop()
    slowest = 0.0
    for _ in range(probes):
        started = loop.time()
        async with http.get(proxy.url + "/healthz") as response:
            assert response.status == 200
            await response.read()
        slowest = max(slowest, loop.time() - started)
    return slowest


async def pieces(body: bytes) -> AsyncIterator[memoryview]:
    """`body` in 1 MiB pieces: one write of many megabytes would stall the test's own loop, and its polls with it."""
    view = memoryview(body)
    for start in range(0, len(body), UPLOAD_PIECE):
        yield view[start : start + UPLOAD_PIECE]


async def post_chat(http: aiohttp.ClientSession, proxy: ProcessProxy, body: bytes) -> None:
    """POST one chat completion (uploaded in pieces) and check the upstream's answer came back."""
    headers = {"Authorization": "Bearer sk-test", "Content-Type": "application/json"}
    async with http.post(proxy.url + "/v1/chat/completions", data=pieces(body), headers=headers) as response:
        answer = await response.read()
    assert response.status == 200, answer[:500]
    assert json.loads(answer)["choices"][0]["message"]["content"] == REPLY


async def healthy_while_in_flight(proxy: ProcessProxy, bodies: Iterable[bytes]) -> None:
    """Send `bodies` at once while polling `/healthz`; no poll may be a stall of the time they were in flight."""
    polls: list[float] = []
    async with aiohttp.ClientSession() as http:
        idle = await idle_wait(http, proxy)
        with ControlServer() as machine:
            control = HealthProbe("127.0.0.1", machine.port)
            stop = asyncio.Event()
            poller = asyncio.create_task(poll_healthz(http, proxy, stop, polls))
            loop = asyncio.get_running_loop()
            started = loop.time()
            try:
                async with asyncio.timeout(IN_FLIGHT_LIMIT):
                    await asyncio.gather(*(post_chat(http, proxy, body) for body in bodies))
                in_flight = loop.time() - started
                stop.set()
                await poller
            finally:
                machine_waits = control.stop()
    assert len(polls) >= 2  # the polls really overlapped the requests
    assert_no_stall(polls, in_flight, idle, machine_waits)


def one_word_messages(count: int, tag: str) -> bytes:
    """A chat completion of `count` distinct one-word user messages."""
    messages = [{"role": "user", "content": f"{tag}{index}"} for index in range(count)]
    return json.dumps({"model": MODEL, "messages": messages}).encode()


async def test_healthz_answers_while_200k_messages_are_in_flight(start_process_proxy: StartProcessProxy) -> None:
    async with FixedUpstream() as upstream:
        proxy = await start_process_proxy(upstream.base_url, max_messages=1_000_000)
        # The second request meets a token-count cache the first one filled: the case that was quadratic.
        for tag in ("a", "b"):
            body = one_word_messages(200_000, tag)
            assert 7_000_000 < len(body) < 9_000_000
            await healthy_while_in_flight(proxy, [body])
        assert upstream.requests == 2


async def test_healthz_answers_while_four_60mb_bodies_are_in_flight(start_process_proxy: StartProcessProxy) -> None:
    async with FixedUpstream() as upstream:
        proxy = await start_process_proxy(upstream.base_url)
        words = "word " * 300_000  # 1.5 MB
        bodies = [
            json.dumps(
                {"model": MODEL, "messages": [{"role": "user", "content": f"{k} {j} {words}"} for j in range(40)]}
            ).encode()
            for k in range(4)
        ]
        assert all(60_000_000 <= len(body) < 64 * 1024 * 1024 for body in bodies)
        await healthy_while_in_flight(proxy, bodies)
        assert upstream.requests == 4


async def test_the_first_request_to_count_costs_what_the_next_does(start_process_proxy: StartProcessProxy) -> None:
    # A fresh process has no tokenizer loaded: loaded by the first request to count, it held the loop ~0.5 s, 8x
    # what the next request of the same size took.
    async with FixedUpstream() as upstream, aiohttp.ClientSession() as http:
        proxy = await start_process_proxy(upstream.base_url, context_windows={MODEL: 4000})
        loop = asyncio.get_running_loop()
        took = []
        for tag in ("first", "second"):
            started = loop.time()
            await post_chat(http, proxy, one_word_messages(2_000, tag))
            took.append(loop.time() - started)
        assert upstream.requests == 2
    first, second = took
    assert first < FIRST_REQUEST_FACTOR * second, (first, second)
