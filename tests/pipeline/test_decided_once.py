"""What a request's decision reads once, or remembers across requests, is what reading it afresh gives.

The pipeline resolves a request's window once (a discovered window ranks `above_weaker` what the tables gave), makes
a caller once per headers (`Caller.of`), reads its conversation from headers lowered once (`conversation_of`), and
answers a request sized by its bytes with the same headers a decision under the trigger gets (`estimate_headers`).
Each is compared here with the definition it shortcuts, over random inputs and interleavings.
"""

from __future__ import annotations

import hashlib
import hmac

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.config import Settings
from proxy.config.state import TENANT_HEADERS
from proxy.discovery.service import above_weaker
from proxy.engine import Decision, Outcome, Thresholds
from proxy.formats.anthropic.wire import MESSAGES
from proxy.formats.chat_completions.wire import CHAT_COMPLETIONS
from proxy.pipeline.caller import CONTEXT_WINDOW_HEADER, Caller, conversation_of, state_scope
from proxy.pipeline.reports import estimate_headers, left_as_sent, report_headers, requested_window
from proxy.pipeline.wire import WireFormat
from proxy.windows import KNOWN_CONTEXT_WINDOWS, ContextWindows, WindowSource
from tests.support.examples import examples

MODELS = st.sampled_from([*list(KNOWN_CONTEXT_WINDOWS)[:6], "my-org/model", "unknown", ""]) | st.none()
TOKENS = st.none() | st.integers(0, 2_000_000)
TENANTS = st.sampled_from([b"a" * 16, b"b" * 16])


@settings(max_examples=examples(300))
@given(
    model=MODELS,
    requested=TOKENS,
    tenant=TENANTS,
    learned=st.lists(st.tuples(MODELS, st.integers(1, 10**6), TENANTS), max_size=3),
    configured=st.booleans(),
    default=TOKENS,
    shipped=TOKENS,
    discovered=TOKENS,
)
def test_a_discovered_window_is_ranked_as_resolving_again_ranks_it(
    *,
    model: str | None,
    requested: int | None,
    tenant: bytes,
    learned: list[tuple[str | None, int, bytes]],
    configured: bool,
    default: int | None,
    shipped: int | None,
    discovered: int | None,
) -> None:
    """Discovery is asked only when the tables gave the table's window, the default or none (`_WEAKER`)."""
    windows = ContextWindows({"my-org/": 32_768} if configured else None, default)
    for name, window, owner in learned:
        windows.learn(name, window, owner)
    known = windows.resolve_window(model, requested, tenant, shipped=shipped)
    if known is not None and known.source not in (WindowSource.TABLE, WindowSource.DEFAULT):
        return
    again = windows.resolve_window(model, requested, tenant, discovered, shipped=shipped)
    assert above_weaker(known, discovered) == again


WINDOWS = ["8000", " 8000 ", " " * 20 + "8000", "8000" + " " * 20, "1" * 12, "1" * 13, "1" * 14, "-1", "x" * 20]
HEADER_VALUES = st.sampled_from(["", "Bearer sk-alice", "Bearer sk-bob", "k", *WINDOWS])
CALLER_HEADERS = st.dictionaries(st.sampled_from([*TENANT_HEADERS, CONTEXT_WINDOW_HEADER, "other"]), HEADER_VALUES)
KEYS = ["k" * 32, "j" * 32]


@settings(max_examples=examples(200))
@given(st.lists(st.tuples(st.sampled_from(KEYS), CALLER_HEADERS, st.sampled_from([None, "responses"])), max_size=30))
def test_a_remembered_caller_is_the_one_its_headers_make_under_its_own_key(
    calls: list[tuple[str, dict[str, str], str | None]],
) -> None:
    keyed = {key: Settings(tenant_key=key) for key in KEYS}
    for key, headers, scope in calls:
        material = "\n".join(f"{name}:{headers.get(name, '')}" for name in TENANT_HEADERS)
        tenant = bytes.fromhex(hmac.new(key.encode(), material.encode(), hashlib.sha256).hexdigest()[:32])
        requested, warning = requested_window(headers.get(CONTEXT_WINDOW_HEADER))
        expected = Caller(tenant, requested, warning, state_scope(tenant, requested, scope))
        assert Caller.of(headers, keyed[key], scope) == expected
        assert Caller.of(headers, keyed[key], scope).tenant.hex() == keyed[key].tenant_of(headers)


NAMES = st.sampled_from(["X-Conversation-Id", "x-conversation-id", "X-Claude-Code-Session-Id", "session_id", "Other"])


@settings(max_examples=examples(200))
@given(st.dictionaries(NAMES, st.text(max_size=4)), st.sampled_from([CHAT_COMPLETIONS, MESSAGES, None]))
def test_the_conversation_of_lowered_headers_is_the_conversation_of_the_headers(
    headers: dict[str, str], wire: WireFormat | None
) -> None:
    configured = Settings()
    lowered = {name.lower(): value for name, value in headers.items()}
    expected = conversation_of(headers, configured, wire)
    assert conversation_of(lowered, configured, wire, lowered=True) == expected


@settings(max_examples=examples(200))
@given(
    window=st.integers(1, 2_000_000),
    reserved=st.integers(0, 3_000_000),
    client_compacts=st.booleans(),
    bound=st.integers(0, 2_000_000),
)
def test_a_request_sized_by_its_bytes_answers_the_headers_of_a_bounded_decision(
    window: int, reserved: int, client_compacts: bool, bound: int
) -> None:
    thresholds = Thresholds(window, 0.7, 0.4, reserved, client_compacts)
    decided = Outcome(Decision(bound, compact=False, bounded=True))
    assert estimate_headers(left_as_sent(thresholds), thresholds, bound, bounded=True) == report_headers(
        decided, thresholds
    )
