"""Two replicas saving the same conversation's rewrite at once: nothing is lost, nothing forks.

Each replica is its own RedisStore (its own connection pool) on one real redis-server, and the saves really race:
they are issued together and interleave on the wire.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.engine import COMPACTION_META_KEY
from proxy.engine.plan import Created, EditPlan, Kept
from proxy.state.redis import RedisStore

TENANT = b"r" * 16
KEYS = 150

RACE_TIMEOUT = 30.0
"""Seconds a raced command may wait for a connection and for Redis: a bound against a hang, not a measure."""


def _note(text: str, replaces: int | None = None) -> Created:
    return Created({"role": "user", "content": text}, {COMPACTION_META_KEY: {"strategy": "test"}}, replaces)


BASE = EditPlan.identity(10)
"""What replica A carries forward: the plan found at an earlier prefix, extended."""
DROP_THREE = BASE.then(EditPlan(10, (Kept(0), _note("[3 removed]"), *(Kept(i) for i in range(4, 10)))))
DROP_FOUR = BASE.then(EditPlan(10, (Kept(0), _note("[4 removed]"), *(Kept(i) for i in range(5, 10)))))
PRUNE_SEVEN = BASE.then(EditPlan(10, (*(Kept(i) for i in range(7)), _note("pruned", 7), Kept(8), Kept(9))))
LATER = DROP_FOUR.then(EditPlan(7, (Kept(0), _note("[6 removed]"), *(Kept(i) for i in range(4, 7)))))


def _key(number: int) -> bytes:
    return hashlib.blake2b(f"race:{number}".encode(), digest_size=16).digest()


PREFIX = [hashlib.blake2b(f"race-prefix:{index}".encode(), digest_size=16).digest() for index in range(9)]
"""The chain before a key: a plan over ten messages is stored under the tenth element of its chain."""


def _chain(key: bytes) -> list[bytes]:
    return [*PREFIX, key]


@pytest.fixture
async def replicas(redis_url: str) -> AsyncIterator[tuple[RedisStore, RedisStore]]:
    prefix = f"race:{uuid.uuid4().hex}:"
    # 150 saves at once per replica queue for its 64 connections: on a loaded machine a wait can pass the default
    # second, and the store then fails the save as it must; these tests are about what the races leave, not timeouts.
    first, second = (RedisStore(redis_url, 60, prefix, timeout_seconds=RACE_TIMEOUT) for _ in range(2))
    yield first, second
    await first.close()
    await second.close()


async def _race(replicas: tuple[RedisStore, RedisStore], plan_a: EditPlan, plan_b: EditPlan) -> list[EditPlan]:
    """For KEYS keys at once, replica A saves `plan_a` and replica B `plan_b`; return what each key holds after."""
    a, b = replicas
    saves: list[Any] = []
    for number in range(KEYS):
        # Alternate who is issued first, so both arrival orders occur.
        pair = [a.save_rewrite(TENANT, _key(number), plan_a), b.save_rewrite(TENANT, _key(number), plan_b)]
        saves.extend(pair if number % 2 else reversed(pair))
    await asyncio.gather(*saves)
    found = await asyncio.gather(*(b.latest_rewrite(TENANT, _chain(_key(number))) for number in range(KEYS)))
    assert all(entry is not None for entry in found)
    return [entry[1] for entry in found if entry is not None]


async def test_a_carried_forward_plan_never_erases_a_concurrent_compaction(
    replicas: tuple[RedisStore, RedisStore],
) -> None:
    """Replica A extends the plan it found to the new head while replica B compacts that head: B's plan stays."""
    assert await _race(replicas, BASE, DROP_FOUR) == [DROP_FOUR] * KEYS
    assert await _race(replicas, DROP_FOUR, LATER) == [LATER] * KEYS


async def test_sibling_compactions_converge_on_the_further_one(replicas: tuple[RedisStore, RedisStore]) -> None:
    """Both replicas compact the same head at once; one result is a further compaction of the other: it wins."""
    assert await _race(replicas, DROP_THREE, DROP_FOUR) == [DROP_FOUR] * KEYS


async def test_incomparable_compactions_keep_the_first_written(replicas: tuple[RedisStore, RedisStore]) -> None:
    """A slow replica finishing a different compaction after the first was stored (and replayed) does not fork it."""
    a, b = replicas
    await a.save_rewrite(TENANT, _key(0), DROP_FOUR)
    await b.save_rewrite(TENANT, _key(0), PRUNE_SEVEN)
    assert await a.latest_rewrite(TENANT, _chain(_key(0))) == (9, DROP_FOUR)
    # Raced, exactly one of the two is stored per key, and both replicas read that same one.
    results = await _race(replicas, PRUNE_SEVEN, DROP_FOUR)
    assert set(map(id, results)) and all(plan in (PRUNE_SEVEN, DROP_FOUR) for plan in results)


async def test_a_write_between_judging_and_replacing_is_not_overwritten(
    replicas: tuple[RedisStore, RedisStore],
) -> None:
    """Compare-and-set: A judges its plan supersedes the stored one, B stores a further one before A replaces; B's
    stays, and A's save ends after re-judging instead of clobbering it."""
    a, b = replicas
    key = _key(1)
    await a.save_rewrite(TENANT, key, DROP_THREE)
    real_script = a._save_rewrite
    calls: list[bytes] = []

    async def script_with_interference(*, keys: list[str], args: list[Any]) -> Any:
        result = await real_script(keys=keys, args=args)
        calls.append(args[2])
        if len(calls) == 1:
            await b.save_rewrite(TENANT, key, LATER)  # slips in after A read DROP_THREE
        return result

    a._save_rewrite = script_with_interference  # type: ignore[assignment]
    await a.save_rewrite(TENANT, key, DROP_FOUR)
    assert await a.latest_rewrite(TENANT, _chain(key)) == (9, LATER)
    assert len(calls) == 2, "A tried to replace DROP_THREE once, found LATER instead, and left it"
    assert calls[0] == b"" and calls[1] != b""
