"""Chat completions' exact counts: the upstream's chat template and tokenizer, asked per prefix of a conversation.

Servers that expose their tokenizer and chat template (llama.cpp, vLLM, ...: see `proxy.discovery.tokenize`) can
say the exact prompt size of a chat request, the first of a conversation included.

- Per prefix, remembered: counts are kept by the key of the prefix they count (the caller's tenant, the model, the
  template fields and the engine's hash chain), so a conversation sent again asks nothing, and one that grew asks
  only about the grown prompt (llama.cpp tokenizes only the new text). A count depends on the messages before it
  (templates insert default system prompts, mark the first or the last message), which is why the key is the
  prefix's chain and not a message's own key.
- Which endpoint works is found once: the methods `count_probes` names are tried in order by the first requests;
  the first that answers is used from then on. One that never answered is asked again only after a back-off (a
  minute, doubling to an hour), never in a loop; the back-off is the asking tenant's, so one tenant's bad request
  delays no other tenant's counts, and tries are charged to the probe budget (see `proxy.discovery.trials`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

import orjson
from xxhash import xxh3_128_digest

from proxy.discovery.budget import ProbeKind
from proxy.discovery.budgeted import Outcome
from proxy.discovery.client import CredentialsNeeded, ProbeClient, credentials_of
from proxy.discovery.service import probes_for
from proxy.discovery.tokenize import LOOK_BACK, TEMPLATE_FIELDS, Conversation, Method, methods
from proxy.discovery.trials import Trials
from proxy.engine import Anchor
from proxy.formats.chat_completions.request import ChatRequest
from proxy.names import name_key
from proxy.pipeline.capabilities import CountContext, Counted, CountQuestion
from proxy.pipeline.exact_counts import MAX_COUNTED_BYTES, reported

logger = logging.getLogger("compaction_proxy.compaction")

KEYS: Final = b"chat-template\0"
"""What this source's keys in the shared answers start with."""


class TemplateCounts:
    """Counts chat prompts with the upstream's template and tokenizer (an `ExactCountSource`).

    :param context: The settings (`count_probes`), the probe budget and the shared answers.
    """

    def __init__(self, context: CountContext) -> None:
        known = methods()
        self.methods: list[tuple[str, Method]] = [
            (name, known[name]) for name in probes_for(context.settings, "count_probes") if name in known
        ]
        self.client = ProbeClient(context.settings)
        self.counts = context.answers
        self.trials = Trials([name for name, _ in self.methods], context.budget, ProbeKind.COUNT)

    async def count(self, question: CountQuestion) -> Counted:
        """The count of the longest prefix of the view known, asking for the whole view within the budget."""
        request: ChatRequest = question.request
        model, view, tenant = question.model, question.view, question.tenant
        if not self.methods or not model or not view.chain or question.size > MAX_COUNTED_BYTES:
            return Counted()
        fields = {name: request.body[name] for name in TEMPLATE_FIELDS if name in request.body}
        digest = xxh3_128_digest(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS))
        scope = KEYS + tenant + name_key(model) + digest
        key = scope + view.chain[-1]
        known = self.counts.known(key)
        if known is not None:
            return Counted(Anchor(known, len(view.chain)), Outcome.CACHED)
        if reported(model, question.usage, view):
            return Counted(outcome="reported")
        if not self.trials.usable(tenant):
            # Every method is waiting out this tenant's back-off: nothing would be asked.
            return Counted(outcome=Outcome.FAILED)
        if not self.trials.admit(tenant):
            return Counted(outcome="refused")
        conversation = Conversation(model, view.messages, fields, view.chain, scope)
        credentials = credentials_of(question.headers)
        _, outcome = await self.counts.ask(key, lambda: self._count(conversation, tenant, credentials))
        for covered in range(len(view.chain), max(len(view.chain) - LOOK_BACK, 0), -1):
            tokens = self.counts.known(scope + view.chain[covered - 1])
            if tokens is not None:
                return Counted(Anchor(tokens, covered), outcome)
        return Counted(outcome=outcome)

    def may_ask(self, tenant: bytes) -> bool:
        """Whether a method is not waiting out the tenant's back-off."""
        return bool(self.trials.usable(tenant))

    async def aclose(self) -> None:
        """Close the HTTP client (the shared answers are closed by their owner)."""
        await self.client.aclose()

    async def _count(self, conversation: Conversation, tenant: bytes, credentials: Mapping[str, str]) -> int | None:
        """Ask each method usable for the tenant once, in order, until one answers with a count."""

        async def fetch(method: str, path: str, body: Mapping[str, Any] | None) -> Any:
            return await self.client.fetch(method, path, body, credentials)

        known: dict[str, Method] = dict(self.methods)
        for name in self.trials.usable(tenant):
            try:
                tokens = await known[name](fetch, conversation)
            except CredentialsNeeded:
                tokens = None
            if tokens is not None and tokens > 0:
                if self.trials.succeeded(name):
                    logger.info("The upstream counts prompts exactly (%s); estimates use its counts from now on.", name)
                return tokens
            self.trials.failed(name, tenant)
        return None


class TemplateCounting:
    """Chat completions' `ExactCounting`: `TemplateCounts`."""

    def source(self, context: CountContext) -> TemplateCounts:
        """A `TemplateCounts` for this context."""
        return TemplateCounts(context)
