"""What only some wire formats can do, each declared on the format's `WireFormat` (None where it cannot).

The pipeline asks the request's format for these and never which format it is:

- `ByteSplicing`: the next request of a conversation recognized from its bytes and its body spliced (chat
  completions, whose agents re-send the whole history as one growing JSON array).
- `ProviderHistory`: requests that continue a history the provider keeps (the Responses API's
  `previous_response_id`): forwarded as sent, their sizes learned from the answers.
- `ExactCounting`: where the upstream's own count of a prompt comes from (a chat template's tokenizer, the
  Responses API's `input_tokens`, the Messages API's `count_tokens`).

Each capability object is stateless and shared; what it keeps per proxy (remembered requests, history sizes, count
clients) is made by its factory method, once per pipeline and format, on the format's first request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.config import Settings
from proxy.discovery.budget import ProbeBudget
from proxy.discovery.budgeted import BudgetedAnswers
from proxy.engine import Anchor, TokenCounter
from proxy.engine.messages import Message
from proxy.pipeline.off_loop import OffLoop
from proxy.pipeline.requests import RequestLimits
from proxy.pipeline.rewrites import View
from proxy.pipeline.turn import Continuation, Turn
from proxy.state import StateStore


class SpliceMemory(Protocol):
    """The last request of recent conversations, and the requests recognized as their continuations."""

    async def recognize(self, scope: bytes, raw: bytes, off_loop: OffLoop) -> tuple[Continuation | None, Any]:
        """The request as a remembered one plus new messages (None: parse it in full), and what `remember` reuses."""
        ...

    async def remember(
        self, scope: bytes, raw: bytes, request: Any, turn: Turn, off_loop: OffLoop, *, openings: Any = None
    ) -> None:
        """Remember the request as decided (`turn`) for the conversation's next one; never raises.

        :param openings: The second value `recognize` returned for `raw`, if it was asked.
        """
        ...


class ByteSplicing(Protocol):
    """A format whose requests are recognized from their bytes as a remembered one plus new messages.

    :ivar from_bytes: Bodies from this size are recognized from their bytes; smaller ones parse faster.
    """

    from_bytes: int

    def memory(self, limits: RequestLimits, max_bytes: int, on_failure: Callable[[], None]) -> SpliceMemory:
        """An empty memory costing at most `max_bytes`; `on_failure` counts an error of its own (it fails open)."""
        ...

    def forward(
        self, turn: Turn, raw: bytes, request: Any, messages: list[Message] | None, *, ask_usage: bool
    ) -> tuple[bytes, Any]:
        """The body sending `messages` (`raw`'s when None), spliced into the last one sent where it extends it.

        :returns: The body, and the format's record of it for the next request's splice (`Turn.forwarded`).
        """
        ...

    def splices(self, turn: Turn, messages: list[Message]) -> bool:
        """Whether the body `forward` makes for `messages` is spliced: its work is only the new messages'."""
        ...


class HistorySizes(Protocol):
    """The sizes of histories the provider keeps, learned from its answers."""

    async def forwarded(
        self, raw: bytes, request: Any, scope: bytes, window: int | None, counter: TokenCounter
    ) -> tuple[bytes, str]:
        """The body to send for a request continuing a provider-kept history, and its `X-Compaction` value."""
        ...

    async def learn(self, scope: bytes, request: Any, response_id: str, usage: Mapping[str, Any] | None) -> None:
        """Keep the size of the history through the answer `response_id` (any request of the format's)."""
        ...


class ProviderHistory(Protocol):
    """A format whose requests may continue a history the provider keeps instead of carrying it."""

    def continues(self, request: Any) -> bool:
        """Whether the request carries only what is new, its history kept by the provider."""
        ...

    def sizes(self, store: StateStore, settings: Settings) -> HistorySizes:
        """The history sizes kept in `store`, acted on as `settings` say (`provider_state`, `compact_at`)."""
        ...


@dataclass(frozen=True)
class CountContext:
    """What an exact-count source is made with.

    :param settings: `count_probes`, `exact_count_timeout`, the upstream.
    :param budget: The probe budget tries of counting methods are charged to (shared with window discovery).
    :param answers: The counts in flight and remembered, with their bounded wait, shared by every source: a source's
        keys start with a name of its own.
    """

    settings: Settings
    budget: ProbeBudget
    answers: BudgetedAnswers[int]


@dataclass(frozen=True)
class CountQuestion:
    """What a source is asked to count: the longest prefix of `view` it knows, asking for the whole view.

    :param model: The model the request is for.
    :param request: The request (a `WireRequest` of the source's format): what it sends besides the messages is
        counted with them.
    :param view: What the request sends, as the pipeline will forward it.
    :param tenant: The caller's tenant: counts and back-offs are its own.
    :param headers: The caller's headers (lower-cased names): its credential headers go with the count.
    :param size: The request body's size in bytes.
    :param usage: The usage report anchoring the view's longest reported prefix, if any.
    """

    model: str | None
    request: Any
    view: View
    tenant: bytes
    headers: Mapping[str, str]
    size: int
    usage: Anchor | None


@dataclass(frozen=True)
class Counted:
    """What a source answered: the anchor (None when it has none), and the outcome counted in the metrics (None: none).

    The outcomes are those of `compaction_proxy_exact_counts_total`: `counted`, `cached`, `late`, `failed`,
    `reported`, `refused`.
    """

    anchor: Anchor | None = None
    outcome: str | None = None


class ExactCountSource(Protocol):
    """The upstream's exact count of what a request sends, asked within the budget."""

    async def count(self, question: CountQuestion) -> Counted:
        """The count asked for (see `proxy.pipeline.exact_counts.ExactCounts.anchor`); raising counts as failing."""
        ...

    def may_ask(self, tenant: bytes) -> bool:
        """Whether the tenant's request could be counted now (a method is not waiting out a back-off)."""
        ...

    async def aclose(self) -> None:
        """Stop the counts in flight and close the source's clients."""
        ...


class ExactCounting(Protocol):
    """A format whose prompts the upstream can count exactly."""

    def source(self, context: CountContext) -> ExactCountSource:
        """The source of exact counts for this format's requests."""
        ...


class PromptCounting(Protocol):
    """A format's endpoint that counts a request's prompt without running it (the Messages API's `count_tokens`).

    Its requests carry a request's prompt fields; the proxy sends them as it would forward the matching request
    (`proxy.pipeline.prompt_counts`), so the count describes what the upstream is sent and passes the checks the
    upstream runs on it.
    """

    def serves(self, path: str) -> bool:
        """Whether a POST to `path` is a request to this endpoint."""
        ...

    def body(self, forwarded: bytes) -> bytes:
        """The count request for the body a request would be forwarded with: its prompt fields."""
        ...
