"""OpenAI's input-token counting for the Responses API: the exact input tokens of a Responses request.

`POST /v1/responses/input_tokens` takes the fields of a Responses request that make up its input (`model`, `input`,
`instructions`, `tools`, `previous_response_id`, ...) and answers `{"object": "response.input_tokens",
"input_tokens": N}`. It counts the whole input each time, so answers are remembered by the request's input fields:
a request sent again asks nothing. It is a call to OpenAI's API with the caller's key, so it runs only when
`count_probes` names `responses_input_tokens` (opt-in), and within `exact_count_timeout` like every exact count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson
from xxhash import xxh3_128_digest

from proxy.config import Settings
from proxy.discovery.budgeted import BudgetedAnswers, Outcome
from proxy.discovery.client import CredentialsNeeded, ProbeClient, credentials_of
from proxy.discovery.service import probes_for

PATH: Final = "/v1/responses/input_tokens"
INPUT_FIELDS: Final = (
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "previous_response_id",
    "conversation",
    "reasoning",
    "text",
    "truncation",
)
"""The fields of a Responses request the endpoint accepts; the others (`stream`, `store`, ...) do not change it."""
MAX_COUNTS: Final = 16_384
"""Counts remembered (by a digest of the input fields; about 100 bytes each)."""


class ResponsesInputTokens:
    """Counts a Responses request's input tokens with OpenAI's endpoint, within the budget, remembered per input.

    :param settings: `count_probes` (off unless it names `responses_input_tokens`), `exact_count_timeout`, the
        upstream.
    """

    def __init__(self, settings: Settings) -> None:
        self.enabled = "responses_input_tokens" in probes_for(settings, "count_probes")
        self.client = ProbeClient(settings)
        self.counts: BudgetedAnswers[int] = BudgetedAnswers(settings.exact_count_timeout, MAX_COUNTS)

    async def count(
        self, body: Mapping[str, Any], tenant: bytes, headers: Mapping[str, str]
    ) -> tuple[int | None, Outcome]:
        """The request's input tokens as OpenAI counts them, or None (off, no model, late, failed or nonsense).

        :param body: The Responses request body.
        :param tenant: The caller's tenant: counts are remembered per tenant.
        :param headers: The caller's headers (lower-cased names): its credentials pay for the count.
        """
        fields = {name: body[name] for name in INPUT_FIELDS if name in body}
        if not self.enabled or not isinstance(fields.get("model"), str):
            return None, Outcome.FAILED
        key = tenant + xxh3_128_digest(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS))
        credentials = credentials_of(headers)
        return await self.counts.ask(key, lambda: self._ask(fields, credentials))

    async def aclose(self) -> None:
        """Stop the counts in flight and close the HTTP client."""
        await self.counts.aclose()
        await self.client.aclose()

    async def _ask(self, fields: Mapping[str, Any], credentials: Mapping[str, str]) -> int | None:
        try:
            answer = await self.client.fetch("POST", PATH, fields, credentials)
        except CredentialsNeeded:
            return None
        tokens = answer.get("input_tokens") if isinstance(answer, Mapping) else None
        valid = isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0
        return tokens if valid and answer.get("object") == "response.input_tokens" else None
