"""A client that compacts its conversation itself is deferred to: the proxy is the safety net under it.

Codex CLI writes its own handoff summary at about 0.9 of its window, Claude Code compacts itself too, and a
Responses client may have the provider compact for it. The proxy's trigger at `compact_at` would fire first and hand
the user its lossy chain instead of the compaction they configured. So where a client is known to compact, the
proxy compacts only when the request would not fit the window (the trigger becomes the room the reply leaves, see
`Thresholds.client_compacts`), and after an overflow the provider reports (the usual retry); otherwise it forwards the
request as sent and answers `X-Compaction: deferred`.

Recognized, in this order (the first one found names the signal in `X-Compaction-Deferred`):

- `compaction-request`: the request is the client's own summary request. Only Codex's is known: its last message is
  a user message opening with Codex's compact prompt (`codex-rs/core/templates/compact/prompt.md`). A custom
  `compact_prompt` is not recognized this way; Codex's headers still are.
- `compaction-items`: the request carries a provider compaction item (a Responses `compaction` item, from
  `context_management` or `/v1/responses/compact`): the client has its conversation compacted already.
- `context-management`: the request asks the provider to manage its context (`context_management`, or the Responses
  API's `truncation: auto`). Edits the format translates (`WireRequest.provider_edits`: Anthropic's tool-result
  clearing) are not a deferral: the proxy estimates what they leave (`proxy.pipeline.provider_edits`). Their
  compaction is one when it comes at or before the proxy's own trigger; later, the proxy compacts first as usual.
- `codex-cli`: Codex's headers, an `originator` of Codex (`codex_cli_rs`, `codex_exec`, `codex_vscode`, `codex-tui`)
  or a `User-Agent` opening `codex_cli_rs/`.
- `claude-code`: Claude Code's `User-Agent` (`claude-cli/...`).

The operator's `client_compaction` setting decides what is done with it (`auto`: defer when recognized; `defer`:
always, the signal `setting` when nothing else is recognized; `ignore`: never), and a request's
`X-Compaction-Client: auto | defer | ignore` overrides it for that request (signal `header`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from proxy.config import ClientCompaction
from proxy.engine.messages import Message, content_texts, role_of
from proxy.pipeline.wire import WireRequest

POLICY_HEADER: Final = "x-compaction-client"
"""Request header overriding `client_compaction` for one request."""

DEFERRED_HEADER: Final = "X-Compaction-Deferred"
"""Response header naming the signal the proxy deferred to the client's own compaction on."""

INVALID_POLICY_WARNING: Final = "X-Compaction-Client ignored: not auto, defer or ignore"
"""`X-Compaction-Warning` when a request's `X-Compaction-Client` is none of the policies."""

CODEX_COMPACT_PROMPT: Final = "You are performing a CONTEXT CHECKPOINT COMPACTION."
"""How Codex CLI's own compaction request (its last user message) opens."""

_OPENING_CHARS: Final = 256
"""Characters of the last message's first text looked at: the prompt, after any leading whitespace."""

CODEX_ORIGINATORS: Final = frozenset({"codex_cli_rs", "codex_exec", "codex_vscode", "codex-tui"})
"""The `originator` header values of Codex's own clients."""

CODEX_USER_AGENT: Final = "codex_cli_rs/"
CLAUDE_CODE_USER_AGENT: Final = "claude-cli/"

SIGNALS: Final = (
    "compaction-request",
    "compaction-items",
    "context-management",
    "codex-cli",
    "claude-code",
    "header",
    "setting",
)
"""Every signal a deferral may name: the label set of its metric."""


@dataclass(frozen=True)
class Deferral:
    """The proxy defers to this request's client, which compacts itself.

    :param signal: What showed it (one of `SIGNALS`).
    """

    signal: str

    @property
    def headers(self) -> dict[str, str]:
        """What the response says about it (`X-Compaction: deferred` comes with the decision)."""
        return {DEFERRED_HEADER: self.signal}


def deferral(
    policy: ClientCompaction, headers: Mapping[str, str], request: WireRequest, trigger_tokens: float | None = None
) -> tuple[Deferral | None, str | None]:
    """Whether to defer to the request's client, and a warning when its `X-Compaction-Client` was not understood.

    :param policy: The operator's `client_compaction`.
    :param headers: The request's headers, names lower-cased.
    :param trigger_tokens: The proxy's own trigger for the request; None (unknown) defers to any provider compaction.
    """
    asked = headers.get(POLICY_HEADER)
    warning = None
    forced = "setting"
    if asked is not None:
        try:
            policy, forced = ClientCompaction(asked.strip().lower()), "header"
        except ValueError:
            warning = INVALID_POLICY_WARNING
    if policy is ClientCompaction.IGNORE:
        return None, warning
    signal = recognized(headers, request, trigger_tokens)
    if signal is None and policy is ClientCompaction.DEFER:
        signal = forced
    return (Deferral(signal) if signal else None), warning


def recognized(headers: Mapping[str, str], request: WireRequest, trigger_tokens: float | None = None) -> str | None:
    """The first signal (see the module docstring) that the request's client compacts itself, or None."""
    if _is_codex_compaction_request(request.last_message):
        return "compaction-request"
    signal = request.compaction_signal
    if signal is not None:
        return signal
    edits = request.provider_edits
    if edits is not None and edits.compacts_before(trigger_tokens):
        return "context-management"
    user_agent = headers.get("user-agent", "")
    if headers.get("originator", "").strip() in CODEX_ORIGINATORS or user_agent.startswith(CODEX_USER_AGENT):
        return "codex-cli"
    if user_agent.startswith(CLAUDE_CODE_USER_AGENT):
        return "claude-code"
    return None


def _is_codex_compaction_request(last: Message | None) -> bool:
    """Whether the last message is a user message opening with Codex's compact prompt."""
    if last is None or role_of(last) != "user":
        return False
    opening = next(content_texts(last), "")[:_OPENING_CHARS]
    return opening.lstrip().startswith(CODEX_COMPACT_PROMPT)
