"""Looking up a conversation's rewrite over only its new messages gives what a lookup over all of them gives.

`RewriteMemory.find` with the keys of the request a new one extends skips the old part of the chain when a lookup
over it found no rewrite and the memory store has saved none since. Any rewrite saved in between, at any position,
must still be found. A rewrite found behind the head is stored again at the head only now and then.
"""

from __future__ import annotations

from proxy.engine import EditPlan
from proxy.pipeline.rewrites import RESTORE_AFTER_MESSAGES, RewriteMemory
from proxy.state.memory import MemoryStore

SCOPE = b"tenant-scope"


def messages(count: int) -> list[dict[str, str]]:
    return [{"role": "user" if index % 2 == 0 else "assistant", "content": f"turn {index}"} for index in range(count)]


async def test_a_rewrite_saved_after_a_miss_is_found_at_any_position() -> None:
    memory = RewriteMemory(MemoryStore())
    first = memory.keyed(SCOPE, messages(6), 600)
    assert await memory.find(SCOPE, first) is None
    # Another request of the conversation compacted its first four messages meanwhile.
    await memory.store.save_rewrite(SCOPE, first.chain[3], EditPlan.identity(4))
    second = first.extended(messages(8), 800)
    found = await memory.find(SCOPE, second, first)
    assert found is not None and found[0] == 3


async def test_with_nothing_saved_since_a_miss_the_new_part_is_still_looked_up() -> None:
    store = MemoryStore()
    memory = RewriteMemory(store)
    first = memory.keyed(SCOPE, messages(6), 600)
    assert await memory.find(SCOPE, first) is None
    second = first.extended(messages(8), 800)
    assert await memory.find(SCOPE, second, first) is None
    # A rewrite stored for the extended request itself (its head) is found from the keys of the one before.
    await store.save_rewrite(SCOPE, second.chain[-1], EditPlan.identity(8))
    third = second.extended(messages(10), 1000)
    found = await memory.find(SCOPE, third, second)
    assert found is not None and found[0] == 7


async def test_a_rewrite_is_stored_again_at_the_head_once_it_lies_sixteen_messages_back() -> None:
    store = MemoryStore()
    memory = RewriteMemory(store)
    keyed = memory.keyed(SCOPE, messages(4), 400)
    await store.save_rewrite(SCOPE, keyed.chain[-1], EditPlan.identity(4))
    stored_at = 3
    for length in range(6, 4 + 3 * RESTORE_AFTER_MESSAGES, 2):  # an agent's turns: two new messages each
        keyed = keyed.extended(messages(length), length * 100)
        saved = store.rewrites_saved
        found = await memory.find(SCOPE, keyed)
        assert found is not None and found[0] == stored_at  # found where it was last stored, whatever the distance
        assert found[1] == EditPlan.identity(length)
        if length - (stored_at + 1) >= RESTORE_AFTER_MESSAGES:
            assert store.rewrites_saved == saved + 1
            stored_at = length - 1
        else:
            assert store.rewrites_saved == saved  # storing the whole plan again every turn would cost it every turn
    assert stored_at > 3 + RESTORE_AFTER_MESSAGES  # stored again more than once
