"""Finding an offloaded text again in the original a client re-sends: as sent, or JSON-minified as offloaded."""

from __future__ import annotations

import json

from proxy.engine.strategies.json_minify import minified
from proxy.engine.strategies.offload import content_reference
from proxy.pipeline.offload.reads import resent_originals

PLAIN = "step 1 failed\n" * 50
PRETTY = json.dumps({"rows": [{"id": n, "name": f"row {n}"} for n in range(20)]}, indent=2)


def test_each_reference_is_found_in_the_tool_result_it_came_from() -> None:
    compact = minified(PRETTY)
    assert compact is not None
    messages = [
        {"role": "assistant", "content": PLAIN},  # neither a tool result nor the user's: never looked at
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": PLAIN}]},
        {"role": "tool", "tool_call_id": "c2", "content": PRETTY},
    ]
    wanted = {content_reference(PLAIN), content_reference(compact), content_reference("never sent")}
    assert resent_originals(messages, wanted) == {content_reference(PLAIN): PLAIN, content_reference(compact): compact}
    assert resent_originals(messages[:1], {content_reference(PLAIN)}) == {}


def test_a_user_message_the_window_offloaded_is_found_as_sent() -> None:
    messages = [{"role": "assistant", "content": "Noted."}, {"role": "user", "content": PLAIN}]
    assert resent_originals(messages, {content_reference(PLAIN)}) == {content_reference(PLAIN): PLAIN}
