"""A rewrite remembered before the leading block was protected does not carry its loss on when it is replayed.

Plans live in the state store for as long as their conversation does, Redis included, so a plan an earlier version
made (the base prompt cut by `middle_out`, the stated environment dropped by `sliding_window`) is still replayed
after an upgrade. The replayed view opens with the block as the client sends it.
"""

from __future__ import annotations

from typing import Any

from proxy.engine import EditPlan, Kept
from proxy.engine.transcript import created
from proxy.pipeline.rewrites import RewriteMemory
from proxy.state.memory import MemoryStore

SCOPE = b"tenant-scope"
BLOCK: list[dict[str, Any]] = [
    {"role": "developer", "content": "You are Codex. " + "Follow the rules. " * 200},
    {"role": "user", "content": [{"type": "text", "text": "<environment_context>\n  <cwd>/repo</cwd>\n"}]},
]


def conversation(turns: int) -> list[dict[str, Any]]:
    rest = [
        {"role": "user" if index % 2 == 0 else "assistant", "content": f"turn {index} " * 50} for index in range(turns)
    ]
    return [*BLOCK, *rest]


async def test_a_plan_that_cut_and_dropped_the_block_replays_it_as_sent() -> None:
    memory = RewriteMemory(MemoryStore())
    first = conversation(6)
    keyed = memory.keyed(SCOPE, first, 10_000)
    cut = created({**first[0], "content": "You are Codex. [... cut ...]"}, "middle_out", replacing=0, removed_tokens=9)
    note = created({"role": "user", "content": "[3 earlier messages were removed.]"}, "sliding_window")
    legacy = EditPlan(len(first), (cut, note, *(Kept(index) for index in range(5, len(first)))))
    await memory.store.save_rewrite(SCOPE, keyed.chain[-1], legacy)

    grown = conversation(8)
    later = memory.keyed(SCOPE, grown, 12_000)
    found = await memory.find(SCOPE, later)
    assert found is not None
    view = memory.view(SCOPE, later, found[1])
    assert view.messages[: len(BLOCK)] == BLOCK
    assert view.messages[len(BLOCK)] == note.message
    assert view.messages[len(BLOCK) + 1 :] == grown[5:]
    assert all(message is not cut.message for message in view.messages)
