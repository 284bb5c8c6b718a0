"""`Deadlines` cuts a wait as `asyncio.timeout` would: the waits past their limit, only those, and only by the limit."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.server.deadlines import Deadlines
from tests.support.examples import examples


class TimedOut(Exception):
    """The wait outlasted its limit."""


async def wait(deadlines: Deadlines, gate: asyncio.Event) -> str:
    """Wait for `gate` within the limit, as the upstream exchange waits for its answer's headers."""
    task = deadlines.begin()
    try:
        await gate.wait()
    except asyncio.CancelledError:
        if deadlines.end(task, cancelled=True):
            raise TimedOut from None
        raise
    deadlines.end(task, cancelled=False)
    return "answered"


async def test_a_wait_past_its_limit_times_out() -> None:
    with pytest.raises(TimedOut):
        await wait(Deadlines(0.01), asyncio.Event())


async def test_a_wait_answered_in_time_is_not_cut_and_the_task_goes_on() -> None:
    deadlines, gate = Deadlines(0.01), asyncio.Event()
    gate.set()
    assert await wait(deadlines, gate) == "answered"
    await asyncio.sleep(0.02)  # the limit's time passes after the wait ended: nothing is cancelled
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_a_cancellation_from_elsewhere_is_not_taken_for_the_limit() -> None:
    deadlines = Deadlines(3600)
    waiting = asyncio.ensure_future(wait(deadlines, asyncio.Event()))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


@settings(max_examples=examples(30))
@given(st.lists(st.booleans(), min_size=1, max_size=8))
def test_of_many_waits_those_answered_end_well_and_the_rest_time_out(answered: list[bool]) -> None:
    async def run() -> list[str]:
        deadlines = Deadlines(0.01)
        gates = [asyncio.Event() for _ in answered]
        waits = [asyncio.ensure_future(wait(deadlines, gate)) for gate in gates]
        await asyncio.sleep(0)  # every wait has begun
        for gate, answer in zip(gates, answered, strict=True):
            if answer:
                gate.set()
        results = await asyncio.gather(*waits, return_exceptions=True)
        return ["answered" if result == "answered" else type(result).__name__ for result in results]

    outcomes = asyncio.run(run())
    assert outcomes == ["answered" if answer else "TimedOut" for answer in answered]
