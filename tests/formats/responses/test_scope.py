"""A Responses conversation's state is its own: never replayed onto a chat completion with the same messages."""

from __future__ import annotations

from proxy.formats import FORMATS
from proxy.formats.chat_completions.wire import CHAT_COMPLETIONS
from proxy.pipeline.caller import state_scope


def test_each_wire_format_and_window_override_has_its_own_scope() -> None:
    tenant = bytes(32)
    scopes = {state_scope(tenant, window, api) for window in (None, 4096) for api in (wire.scope for wire in FORMATS)}
    assert len(scopes) == 2 * len(FORMATS)
    assert state_scope(tenant, None, CHAT_COMPLETIONS.scope) == tenant
