"""The server's two calls into the pipeline, for every route that compacts (HTTP and WebSocket alike).

`prepare` asks what to forward for a request body, `complete` reports what the upstream answered (and gets the
compacted retry after an overflow). Both fail open: an exception of the pipeline, or an answer of the wrong type, is
counted and logged (`compaction_proxy_fail_open_total{stage}`), and the request goes on as if the proxy were not
there.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import types
from collections.abc import Awaitable, Coroutine, Generator, Mapping
from typing import Any, TypeVar

from aiohttp import web

from proxy.failures import log_failure
from proxy.pipeline.exchange import ForwardPlan, IncomingRequest, Refusal, UpstreamOutcome
from proxy.pipeline.wire import WireFormat
from proxy.server.keys import COMPACTION, METRICS, RECORD, ROUTE
from proxy.server.logging import SERVER_LOGGER

log = logging.getLogger(SERVER_LOGGER)

Result = TypeVar("Result")


def _fail_open(request: web.Request, stage: str, exc: BaseException) -> None:
    """Count and log a compaction-side failure: exception type and stack only, never its message (may quote a body)."""
    request.app[METRICS].fail_open.labels(stage=stage).inc()
    request[RECORD].fail_open.append(stage)
    log_failure(log, "compaction side failed; forwarding unchanged", exc, stage=stage)


async def prepare(
    request: web.Request, body: bytes, wire: WireFormat, headers: Mapping[str, str] | None = None
) -> ForwardPlan | Refusal | None:
    """The compaction side's plan for `body`, or its refusal; None (counted, logged) when it failed.

    :param headers: The headers the compaction side reads; the request's own when None.
    """
    try:
        incoming = IncomingRequest(
            body=body,
            headers=request.headers if headers is None else headers,
            path=request.path,
            wire=wire,
            route=request[ROUTE].name,
        )
        plan = await request.app[COMPACTION].prepare(incoming)
        if isinstance(plan, Refusal):
            return plan
        if not isinstance(plan, ForwardPlan) or not isinstance(plan.body, bytes):
            raise TypeError(f"prepare() returned {type(plan).__name__}, not a ForwardPlan with a bytes body")
    except Exception as exc:
        _fail_open(request, "prepare", exc)
        return None
    record = request[RECORD]
    if plan.failed_open is not None:
        # The compaction side logged its own failure; the server counts every fail-open in one place.
        request.app[METRICS].fail_open.labels(stage=plan.failed_open).inc()
        record.fail_open.append(plan.failed_open)
    record.model = plan.model
    record.stream = plan.stream
    record.decided(plan.response_headers)
    return plan


async def prepare_count(request: web.Request, body: bytes, wire: WireFormat) -> ForwardPlan | None:
    """What the compaction side sends for a request to `wire`'s prompt-counting endpoint; None: the client's body.

    A compaction side without `prepare_count` sends every count as it came; one that raises is counted and logged
    (stage `count`), and the count goes as it came.
    """
    shape = getattr(request.app[COMPACTION], "prepare_count", None)
    if not callable(shape):
        return None
    try:
        incoming = IncomingRequest(body, request.headers, request.path, wire, request[ROUTE].name)
        return _plan_or_none(await shape(incoming), "prepare_count")
    except Exception as exc:
        _fail_open(request, "count", exc)
        return None


def complete(request: web.Request, plan: ForwardPlan, outcome: UpstreamOutcome) -> Awaitable[ForwardPlan | None]:
    """Report the outcome; shielded, so a client leaving at that moment does not lose what the upstream reported.

    The usage is counted at once; the report is made when the result is awaited.
    """
    count_usage(request, outcome.usage)
    return shielded(_report(request, plan, outcome))


async def _report(request: web.Request, plan: ForwardPlan, outcome: UpstreamOutcome) -> ForwardPlan | None:
    """The compaction side's `complete`: its retry plan, if any; None (counted, logged) when it failed."""
    try:
        retry = _plan_or_none(await request.app[COMPACTION].complete(plan, outcome), "complete")
        if plan.cache_misses is not None:
            request[RECORD].cache_misses = plan.cache_misses
        return retry
    except Exception as exc:
        _fail_open(request, "complete", exc)
        return None


async def shielded(work: Coroutine[Any, Any, Result]) -> Result:
    """`await asyncio.shield(work)`, with a task only if `work` suspends: cancelling the caller never cancels it.

    Its first step runs at once; most reports end there, and then no task is scheduled nor a loop turn waited for.
    One that suspends goes on in a task, shielded as `asyncio.shield` would have from the start. On Python 3.12 and
    later that is an eagerly started task; on 3.11 the first step runs within the caller's task (`_resumed` hands the
    rest to a new one), so `work` must not arm `asyncio.timeout` before it first suspends (nothing the pipeline does).
    """
    if sys.version_info >= (3, 12):
        task = asyncio.Task(work, loop=asyncio.get_running_loop(), eager_start=True)
        return task.result() if task.done() else await asyncio.shield(task)
    try:
        first = work.send(None)
    except StopIteration as done:
        result: Result = done.value
        return result
    return await asyncio.shield(asyncio.ensure_future(_resumed(work, first)))


@types.coroutine
def _resumed(work: Coroutine[Any, Any, Result], first: Any) -> Generator[Any, None, Result]:
    """Go on with `work`, whose first step yielded `first` (what it waits on), as the task running it would have."""
    try:
        yield first
    except BaseException as exc:  # thrown in by the task (it was cancelled): `work` is told, as it would have been
        return (yield from _thrown(work, exc))
    return (yield from work.__await__())


@types.coroutine
def _thrown(work: Coroutine[Any, Any, Result], exc: BaseException) -> Generator[Any, None, Result]:
    """Throw `exc` into the suspended `work` and go on with it from there."""
    try:
        step = work.throw(exc)
    except StopIteration as done:
        result: Result = done.value
        return result
    return (yield from _resumed(work, step))


def count_usage(request: web.Request, usage: Mapping[str, Any] | None) -> None:
    """Count an upstream call's usage report (chat completion field names) in the metrics and the request's record."""
    request.app[METRICS].count_usage(usage)
    request[RECORD].used(usage)


def _plan_or_none(plan: object, method: str) -> ForwardPlan | None:
    """`plan` when it is None or a `ForwardPlan` with a bytes body; a TypeError naming `method` otherwise."""
    if plan is None or (isinstance(plan, ForwardPlan) and isinstance(plan.body, bytes)):
        return plan
    raise TypeError(f"{method}() returned {type(plan).__name__}, not a ForwardPlan with a bytes body")
