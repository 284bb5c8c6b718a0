"""`shielded` keeps `asyncio.shield`'s promise (the caller leaving never stops the work) without a task when it can."""

from __future__ import annotations

import asyncio

import pytest

from proxy.server.pipeline_calls import shielded


class Failed(Exception):
    """What the work raised."""


async def at_once(value: int) -> int:
    return value


async def after(gate: asyncio.Event, value: int, done: list[int], finished: asyncio.Event | None = None) -> int:
    await gate.wait()
    done.append(value)
    if finished is not None:
        finished.set()
    return value


async def failing_after_a_turn() -> int:
    await asyncio.sleep(0)
    raise Failed


async def failing_at_once() -> int:
    raise Failed


async def test_work_that_never_suspends_gives_its_result() -> None:
    assert await shielded(at_once(3)) == 3


async def test_work_that_suspends_gives_its_result() -> None:
    gate, done = asyncio.Event(), list[int]()
    waiting = asyncio.ensure_future(shielded(after(gate, 5, done)))
    await asyncio.sleep(0)
    gate.set()
    assert await waiting == 5 and done == [5]


async def test_the_caller_leaving_does_not_stop_the_work() -> None:
    gate, done, finished = asyncio.Event(), list[int](), asyncio.Event()
    waiting = asyncio.ensure_future(shielded(after(gate, 7, done, finished)))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert done == []
    gate.set()
    await finished.wait()  # the work went on in a task of its own
    assert done == [7]


@pytest.mark.parametrize("suspends", [False, True])
async def test_what_the_work_raises_reaches_the_caller(suspends: bool) -> None:
    with pytest.raises(Failed):
        await shielded(failing_after_a_turn() if suspends else failing_at_once())
