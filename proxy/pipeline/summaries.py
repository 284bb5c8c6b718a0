"""Summaries for the proxy: written by the upstream, ahead of time, once per span, served from its prompt cache.

A summary request is the conversation exactly as it was last forwarded (same model, tools and messages, byte for
byte) followed by one instruction naming the messages to condense, so the provider's prompt cache serves everything
but the instruction. It is started in the background when a conversation crosses `precompact_at`, keyed by the
hash chain of the conversation through the last message it covers; when compaction is due, a ready summary is
applied at no added latency, one still being written is awaited up to `summary_wait_seconds`, and anything else
falls back to the rest of the chain. The rewrite memory then replays the summary on every later turn, so each span
is summarized once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
import orjson

from proxy.config import CREDENTIAL_HEADERS, Settings
from proxy.engine import EditPlan, Transcript
from proxy.engine.messages import Message
from proxy.engine.strategies.offload import held_references
from proxy.engine.strategies.summarization import SUMMARY_SECTIONS, SummarySpans, summary_plan
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.offload.tool import as_forwarded
from proxy.pipeline.wire import WireFormat, WireRequest
from proxy.upstream_session import upstream_session

logger = logging.getLogger("compaction_proxy.compaction")

"""Fields of the conversation's own requests that a summary call keeps; the rest (streaming, sampling of several
choices, response formats, tool choice) would change what comes back."""

_MAX_JOBS = 10_000
"""Summaries remembered at once (finished ones wait to be used); the oldest are dropped first."""

_QUEUED_PER_CALL = 1
"""Summaries that may wait for a free call slot, per slot (`summary_concurrency`). Each holds its whole conversation
in memory until written, so beyond the running calls and this many waiting per slot no new one is started: the
compaction falls back (reason `busy`)."""

_MAX_ANSWER_BYTES = 4 * 2**20
"""The largest summary answer read from the upstream; a summary is a few thousand tokens, so more is not one."""


class SummaryFailed(Exception):
    """A summary could not be had; `reason` is the metric label of why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class SummaryContext:
    """What a summary call needs of the request it serves.

    :param tenant: The caller's tenant: summaries are scoped by it like all other state.
    :param path: The path the client used (Azure deployments included): a Responses request's call is a response.
    :param request: The client's parsed request, as it came: what forwarding adds to it for the transcript
        summarized (the read tool) the summary call adds the same way.
    :param headers: The client's headers (lower-cased names), for its credential.
    :param chain: The hash chain of the transcript the summary is planned on.
    :param wire: The request's wire format: what the summary call looks like.
    :param answered: How many leading messages of that transcript the provider reported usage for before (the usage
        anchor's `covered`): a prefix it was sent and holds in its cache. None when none is known.
    :param read_tool: The conversation keeps the read tool (`proxy.pipeline.rewrites.View.read_tool`): the summary
        call has it too, even when the transcript holds no offloaded result.
    """

    tenant: bytes
    path: str
    request: WireRequest
    headers: Mapping[str, str]
    chain: Sequence[bytes]
    wire: WireFormat
    answered: int | None = None
    read_tool: bool = False


@dataclass
class _Job:
    """A summary being written (or written) for one span of one conversation."""

    indices: tuple[int, ...]
    task: asyncio.Task[str]
    started: float = field(default_factory=time.monotonic)


class Summaries:
    """Starts, tracks and serves the summaries the proxy's conversations need.

    :param settings: The proxy's settings (upstream, summary model and credential, timeouts, concurrency).
    :param metrics: Where summaries started, used, discarded and fallbacks are counted.
    """

    def __init__(self, settings: Settings, metrics: CompactionMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.spans = SummarySpans(head_share=settings.summary_head_share)
        self.instruction = settings.summary_instruction or SUMMARY_SECTIONS
        self._jobs: OrderedDict[bytes, _Job] = OrderedDict()
        self._semaphore: asyncio.Semaphore | None = None
        self._session: aiohttp.ClientSession | None = None
        self._unfinished = 0

    def start(
        self, context: SummaryContext, transcript: Transcript, target_tokens: int, growth_tokens: int = 0
    ) -> None:
        """Begin writing, in the background, the summary the next compaction will use (once per span).

        :param growth_tokens: How much the conversation may grow until that compaction (see `SummarySpans`).
        """
        self._started(context, transcript, target_tokens, growth_tokens)

    async def plan(self, context: SummaryContext, transcript: Transcript, target_tokens: int) -> EditPlan | None:
        """The plan replacing a span with its summary: ready, awaited up to the deadline, or written now.

        None when nothing can be summarized or the summary cannot be had in time; the reason is counted and the
        chain's remaining strategies take over.
        """
        found = self._started(context, transcript, target_tokens)
        if found is None:
            if self._busy():
                self.metrics.summary_fallbacks.labels("busy").inc()
            return None
        key, job = found
        try:
            text = await asyncio.wait_for(asyncio.shield(job.task), self.settings.summary_wait_seconds)
        except TimeoutError:
            self.metrics.summary_fallbacks.labels("not_ready").inc()
            return None
        except SummaryFailed as failure:
            self._jobs.pop(key, None)
            self.metrics.summary_fallbacks.labels(failure.reason).inc()
            return None
        self._jobs.pop(key, None)
        plan = summary_plan(transcript, list(job.indices), text)
        if plan is None:
            self.metrics.summaries_discarded.inc()
            self.metrics.summary_fallbacks.labels("not_smaller").inc()
            return None
        self.metrics.summaries_used.inc()
        return plan

    def pending(self) -> list[asyncio.Task[str]]:
        """The summary calls still running (for tests and shutdown)."""
        return [job.task for job in self._jobs.values() if not job.task.done()]

    async def aclose(self) -> None:
        """Cancel summaries still being written and close the HTTP client."""
        for job in self._jobs.values():
            job.task.cancel()
        self._jobs.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _started(
        self, context: SummaryContext, transcript: Transcript, target_tokens: int, growth_tokens: int = 0
    ) -> tuple[bytes, _Job] | None:
        """The job for this conversation's longest known prefix, or a new one.

        None when there is nothing to summarize, or when too many summaries are unfinished to start another.
        """
        found = self._find(context)
        if found is not None or self._busy():
            return found
        indices = self.spans.next_span(transcript, target_tokens, growth_tokens)
        if not indices:
            return None
        key = context.tenant + context.chain[max(indices)]
        task = asyncio.create_task(self._write(context, transcript, indices))
        self._unfinished += 1
        task.add_done_callback(self._finished)
        job = _Job(tuple(indices), task)
        self._remember(key, job)
        return key, job

    def _busy(self) -> bool:
        return self._unfinished >= self.settings.summary_concurrency * (1 + _QUEUED_PER_CALL)

    def _finished(self, task: asyncio.Task[str]) -> None:
        """Count a summary as finished, and mark its failure as seen: one written ahead may fail with nobody waiting."""
        self._unfinished -= 1
        if not task.cancelled():
            task.exception()

    def _find(self, context: SummaryContext) -> tuple[bytes, _Job] | None:
        """The job for the longest prefix of this conversation that one was started for, by this tenant.

        Every key starts with the tenant (a fixed-length digest), so another caller's job is never found.
        """
        for index in range(len(context.chain) - 1, -1, -1):
            key = context.tenant + context.chain[index]
            job = self._jobs.get(key)
            if job is not None:
                return key, job
        return None

    def _remember(self, key: bytes, job: _Job) -> None:
        self._jobs[key] = job
        self.metrics.summaries_started.inc()
        while len(self._jobs) > _MAX_JOBS:
            _key, dropped = self._jobs.popitem(last=False)
            dropped.task.cancel()
            self.metrics.summaries_discarded.inc()

    async def _write(self, context: SummaryContext, transcript: Transcript, indices: list[int]) -> str:
        """Ask the upstream for the summary of `indices`, with the forwarded conversation as the cached prefix."""
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.settings.summary_concurrency)
        async with self._semaphore:
            try:
                return await asyncio.wait_for(
                    self._call(context, transcript, indices), self.settings.summary_timeout_seconds
                )
            except TimeoutError:
                raise SummaryFailed("timeout") from None
            except aiohttp.ClientError:
                raise SummaryFailed("upstream_unreachable") from None

    async def _call(self, context: SummaryContext, transcript: Transcript, indices: list[int]) -> str:
        cut = sent_prefix(transcript.messages, indices, context.answered)
        messages, sections, settings = transcript.messages[:cut], self.instruction, self.settings
        wire = context.wire
        held = held_references(transcript.meta[:cut] if transcript.meta else None)
        offered = bool(held) or context.read_tool
        request = as_forwarded(context.request, wire.read_tool, offered, settings.offload_max_tools)
        body = wire.summary_call(request, messages, indices, sections=sections, settings=settings)
        url = self.settings.upstream + context.path
        async with self._client().post(
            url, data=body, headers=self._headers(context), allow_redirects=False
        ) as response:
            if response.status != 200:
                logger.warning(
                    "The upstream answered a summary request with status %d (redirects are not followed); the"
                    " compaction goes on without that summary.",
                    response.status,
                )
                raise SummaryFailed("upstream_error")
            payload = await _read_bounded(response, _MAX_ANSWER_BYTES)
        try:
            answer = orjson.loads(payload)
            text = wire.summary_text(answer)
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            raise SummaryFailed("malformed_answer") from None
        usage = answer.get("usage") if isinstance(answer, dict) else None
        total = wire.usage_in_chat_terms(usage).get("total_tokens") if isinstance(usage, dict) else None
        if isinstance(total, int):
            self.metrics.summary_tokens.inc(total)
        if not isinstance(text, str) or not text.strip():
            raise SummaryFailed("empty")
        return text

    def _client(self) -> aiohttp.ClientSession:
        """The session summary calls go out on, created on first use.

        It talks to the configured upstream only: redirects (not followed), proxies from the environment and cookies
        would carry one caller's conversation, credential or session to another place or another caller. Answers are
        asked for uncompressed and never decompressed, so the size bound holds for what is read. TLS trusts what the
        upstream connection trusts (`upstream_ca_bundle`).
        """
        if self._session is None:
            self._session = upstream_session(self.settings)
        return self._session

    def _headers(self, context: SummaryContext) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        for name in context.wire.call_headers:
            if value := context.headers.get(name):
                headers[name] = value
        if self.settings.summary_api_key is not None:
            headers.update(context.wire.call_credential(self.settings.summary_api_key.get_secret_value()))
            return headers
        for name in CREDENTIAL_HEADERS:
            if value := context.headers.get(name):
                headers[name] = value
        return headers


def sent_prefix(messages: Sequence[Message], indices: Sequence[int], answered: int | None) -> int:
    """How many leading messages a summary call repeats: the prompt answered before, when the span lies within it.

    What the provider answered is in its cache; this turn's new messages are not, and neither is this turn's prompt
    while it is still being read: a summary written ahead goes out beside it, and one written on the turn that
    compacts comes before anything of the turn is sent. An anchor through the reply ends on that reply, which was
    never a prompt: the call stops before it. All messages when nothing was answered before, or the span reaches
    past it.
    """
    cut = min(answered or 0, len(messages))
    if cut and messages[cut - 1].get("role") == "assistant":
        cut -= 1
    return cut if indices and max(indices) < cut else len(messages)


async def _read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The response body, failing the summary as soon as it exceeds `limit` bytes."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            logger.warning("The upstream's answer to a summary request exceeded %d bytes; it was not used.", limit)
            raise SummaryFailed("answer_too_large")
        chunks.append(chunk)
    return b"".join(chunks)
