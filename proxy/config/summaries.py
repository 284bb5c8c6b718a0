"""Settings of the summaries the proxy has the upstream write when `summarization` is in the chain."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr


class SummarySettings(BaseModel):
    """Which model writes summaries, with which credential, when they start and how long they may take."""

    summary_model: str | None = Field(
        default=None,
        description=(
            "Model that writes summaries when `summarization` is in the chain; the request's own model when unset"
            " (the only choice that lets the provider's prompt cache serve the summarized prefix)."
        ),
    )
    summary_api_key: SecretStr | None = Field(
        default=None,
        description=(
            "Credential for summary calls, sent as the request's API takes a key (`Authorization: Bearer` for OpenAI's"
            " APIs, `x-api-key` for the Messages API); the caller's own credential headers when unset. Never logged."
        ),
    )
    precompact_at: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description=(
            "Fraction of the window at which the summary the next compaction will need starts being written in the"
            " background, so it is ready when `compact_at` is reached. Default: `compact_at - 0.1`."
        ),
    )
    summary_head_share: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description=(
            "Share of the compaction target a conversation's compacted head (its instructions, its summaries and what"
            " was kept between them) may take and still be kept byte for byte when it is summarized again, so the"
            " provider's prompt cache keeps serving it; past it, the summaries are merged. 0 rewrites the"
            " conversation from the instructions on at every compaction."
        ),
    )
    summary_wait_seconds: float = Field(
        default=5.0,
        ge=0,
        description=(
            "How long a request that needs a summary waits for one still being written before the chain falls back"
            " to its next strategy."
        ),
    )
    summary_timeout_seconds: float = Field(
        default=120.0, gt=0, description="How long one summary call to the upstream may take before it is abandoned."
    )
    summary_concurrency: int = Field(
        default=4, gt=0, description="Summary calls in flight at once across all conversations."
    )
    summary_instruction: str | None = Field(
        default=None,
        description=(
            "The sections and rules a summary follows, replacing the built-in ones (objective, decisions, work done,"
            " exact identifiers, unresolved)."
        ),
    )
    summary_max_tokens: int | None = Field(
        default=None, gt=0, description="`max_completion_tokens` of a summary call; no limit when unset."
    )
