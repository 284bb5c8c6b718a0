"""Window discovery: the upstream is asked which context window it serves a model with, once, then rarely.

The upstream is asked only about a model whose window nothing stronger gives (the request, an overflow error, the
operator's `context_windows`; see `WindowSource`), with the probes `window_probes` names, all at once; the first in
that order to find a plausible window wins.

- Once per model: one probe run per model at a time, its answer kept for `discovery_refresh_seconds`, then asked
  again in the background while the known window keeps serving.
- Never on a request's critical path twice: only the first request for a model whose window would otherwise be
  unknown (or only the default) waits, at most `discovery_timeout`; every other request takes what is known and
  leaves any probe to the background. A model the shipped table knows never waits.
- Fail open: a run that finds nothing (missing endpoints, errors, timeouts, nonsense) changes nothing, and the model
  is asked again only after a back-off: a minute, doubling each time, up to the refresh interval.
- Bounded: `MAX_LEARNED` models' answers are kept, at most `MAX_RUNNING` runs are in flight, and runs start within
  the probe budget (`probe_runs_per_tenant_per_minute`, `probe_runs_per_minute`; see `proxy.discovery.budget`), so
  a client sending ever new model names cannot multiply its request rate to the upstream: a model refused a run is
  served as if discovery found nothing (the table's window, the default, or none), and asked about by a later request.
- Credentials: probes go out without any. When the upstream finds nothing but refuses some of them (401/403), the
  model is asked again with the asking caller's credential headers, and what that finds is kept for that caller's
  tenant only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from proxy.config import Settings
from proxy.discovery.budget import ProbeBudget, ProbeKind
from proxy.discovery.client import CredentialsNeeded, ProbeClient, cancel, credentials_of
from proxy.discovery.probes import PROBES, Finding, Probe
from proxy.engine.bounded import BoundedCache
from proxy.failures import log_failure
from proxy.names import name_key, shown
from proxy.windows import MAX_LEARNED, ContextWindows, Window, WindowSource

logger = logging.getLogger("compaction_proxy.compaction")

PROVIDER_HOSTS: Final = frozenset({"api.openai.com", "api.anthropic.com"})
"""OpenAI's and Anthropic's own APIs, the default routes' upstreams: not probed unless the probes are set explicitly."""

RETRY_SECONDS: Final = 60.0
"""The first back-off after a run that found nothing, and how soon a provisional window is asked about again."""
MAX_RUNNING: Final = 16
"""Probe runs in flight at once; a model that would need one more is asked about by a later request."""
MAX_MODEL_NAME: Final = 256
"""Longest model name the upstream is asked about: a longer one names no model a server serves."""
_WEAKER: Final = (WindowSource.TABLE, WindowSource.DEFAULT)
"""Sources a discovered window beats."""


@dataclass(frozen=True)
class _Known:
    """What the upstream said about one model (for one tenant, when it wanted credentials).

    :param tokens: The window found, if any (kept through later runs that find nothing).
    :param locked: Nothing was found without credentials, and the upstream refused probes for want of them.
    :param due: When (monotonic seconds) to ask again, in the background.
    :param failures: Consecutive runs that found nothing, for the back-off.
    """

    tokens: int | None
    locked: bool
    due: float
    failures: int


@dataclass(frozen=True)
class _Answer:
    """What one probe run found: the first window in probe order and its probe, or whether the upstream refused."""

    finding: Finding | None = None
    probe: str = ""
    locked: bool = False


def probes_for(settings: Settings, field: str = "window_probes") -> list[str]:
    """The probes to run: `window_probes` (or `count_probes`), except none by default against the big providers' APIs.

    Their models are in the shipped table, and their APIs serve none of the probed endpoints: probing them would only
    send each caller's credentials on requests they never made. Setting the list explicitly still wins.
    """
    if field not in settings.model_fields_set and urlsplit(settings.upstream).hostname in PROVIDER_HOSTS:
        return []
    return list(getattr(settings, field))


def above_weaker(known: Window | None, discovered: int | None) -> Window | None:
    """The window `resolve_window` gives with `discovered`, when without it it gave `known`, weaker or None.

    A discovered window ranks above the table's and the default (`_WEAKER`), and nothing else ranks below it: the
    tables need not be walked again.
    """
    return Window(discovered, WindowSource.DISCOVERED) if discovered else known


class WindowDiscovery:
    """Adds what the upstream says about a model's window to `ContextWindows`.

    :param settings: The probes to run, the wait budget, the refresh interval, the upstream and its connect timeout.
    :param windows: The proxy's windows: what ranks above and below a discovered one.
    :param budget: The probe budget each run is charged to (shared with exact counting).
    """

    def __init__(self, settings: Settings, windows: ContextWindows, budget: ProbeBudget | None = None) -> None:
        self.windows = windows
        self.budget = budget or ProbeBudget.of(settings)
        self.probes: list[tuple[str, Probe]] = [(name, PROBES[name]) for name in probes_for(settings)]
        self.timeout = settings.discovery_timeout
        self.refresh = settings.discovery_refresh_seconds
        self.client = ProbeClient(settings)
        self._known: BoundedCache[bytes, _Known] = BoundedCache(MAX_LEARNED)
        self._running: dict[bytes, asyncio.Task[None]] = {}

    async def resolve(
        self,
        model: str | None,
        requested: int | None,
        tenant: bytes,
        headers: Mapping[str, str],
        *,
        shipped: int | None = None,
    ) -> Window | None:
        """The request's window and its source, discovered when nothing stronger than the table gives one.

        :param headers: The caller's headers (lower-cased names): their credentials go out only if the upstream
            refuses to answer without them.
        :param shipped: The window the request's wire format knows for it, in place of the shipped table's.
        """
        known = self.windows.resolve_window(model, requested, tenant, shipped=shipped)
        if not self.probes or not model or len(model) > MAX_MODEL_NAME or (known and known.source not in _WEAKER):
            return known
        key, answer = self._lookup(model, tenant, headers)
        if answer is not None:  # asked before: what was found, asked again in the background once due
            if answer.due <= time.monotonic():
                self._start(key, model, tenant, credentials_of(headers))
            return above_weaker(known, answer.tokens)
        wait = known is None or known.source is WindowSource.DEFAULT
        if await self._first_run(key, model, tenant, headers, wait=wait):
            # What is known may have changed while the run was awaited (an overflow taught a window).
            answer = self._lookup(model, tenant, headers)[1]
            discovered = answer.tokens if answer is not None else None
            return self.windows.resolve_window(model, requested, tenant, discovered, shipped=shipped)
        return known

    def running(self) -> list[asyncio.Task[None]]:
        """The probe runs in flight (for tests and shutdown)."""
        return list(self._running.values())

    async def aclose(self) -> None:
        """Stop the runs in flight and close the HTTP client."""
        await cancel(self.running())
        await self.client.aclose()

    async def _first_run(
        self, key: bytes, model: str, tenant: bytes, headers: Mapping[str, str], *, wait: bool
    ) -> bool:
        """Start the run for a model never asked about (or one in flight); whether this request waited for it.

        :param wait: Await a run this request starts, within `discovery_timeout`; a run already in flight is
            never awaited again.
        """
        started = key not in self._running
        task = self._start(key, model, tenant, credentials_of(headers))
        if wait and started and task is not None and self.timeout > 0:
            await asyncio.wait({task}, timeout=self.timeout)
            return True
        return False

    def _lookup(self, model: str, tenant: bytes, headers: Mapping[str, str]) -> tuple[bytes, _Known | None]:
        """Where this caller finds the model's answer, and the answer (the tenant's own once credentials are needed).

        :param headers: The caller's headers (lower-cased names): the answer is the tenant's own when the upstream
            wanted credentials and the caller sends some.
        """
        key = name_key(model)
        known = self._known.get(key)
        if known is not None and known.locked and credentials_of(headers):
            key = tenant + key
            known = self._known.get(key)
        return key, known

    def _start(self, key: bytes, model: str, tenant: bytes, credentials: dict[str, str]) -> asyncio.Task[None] | None:
        """The run for `key` in flight, or a new one; None when too many are in flight or the budget is spent."""
        task = self._running.get(key)
        if task is None and len(self._running) < MAX_RUNNING and self.budget.admit(tenant, ProbeKind.WINDOW):
            task = asyncio.create_task(self._run(key, model, tenant, credentials))
            self._running[key] = task
            task.add_done_callback(lambda _: self._running.pop(key, None))
        return task

    async def _run(self, key: bytes, model: str, tenant: bytes, credentials: dict[str, str]) -> None:
        """Ask the upstream about the model and remember the answer under `key`.

        An anonymous run (`key` is the model's own) the upstream refuses is followed by one with the caller's
        credentials, remembered under the caller's tenant.
        """
        try:
            scoped = key != name_key(model)
            answer = await self._ask(model, credentials if scoped else {})
            self._remember(key, model, answer)
            if answer.locked and not scoped and credentials:
                self._remember(tenant + key, model, await self._ask(model, credentials))
        except Exception as error:
            log_failure(logger, "Asking the upstream for a model's context window failed; nothing was learned.", error)

    async def _ask(self, model: str, credentials: Mapping[str, str]) -> _Answer:
        """Run every probe at once; the first in `window_probes` order to find a window wins."""

        async def fetch(method: str, path: str, body: Mapping[str, Any] | None) -> Any:
            return await self.client.fetch(method, path, body, credentials)

        async def one(probe: Probe) -> Finding | CredentialsNeeded | None:
            try:
                return await probe(fetch, model)
            except CredentialsNeeded as refused:
                return refused

        results = await asyncio.gather(*(one(probe) for _, probe in self.probes))
        for (name, _), result in zip(self.probes, results, strict=True):
            if isinstance(result, Finding):
                return _Answer(result, name)
        return _Answer(locked=any(isinstance(result, CredentialsNeeded) for result in results))

    def _remember(self, key: bytes, model: str, answer: _Answer) -> None:
        """Keep what a run found (or, when it found nothing, what was known) until the next run is due."""
        now = time.monotonic()
        previous = self._known.get(key)
        finding = answer.finding
        if finding is not None:
            due = now + (RETRY_SECONDS if finding.provisional else self.refresh)
            self._known.put(key, _Known(finding.tokens, locked=False, due=due, failures=0))
            if previous is None or previous.tokens != finding.tokens:
                logger.info(
                    "The upstream serves model %r with a context window of %d tokens (from probe %s); used unless the"
                    " request, an overflow error or context_windows says otherwise.",
                    shown(model),
                    finding.tokens,
                    answer.probe,
                )
            return
        failures = previous.failures + 1 if previous is not None else 1
        back_off = min(RETRY_SECONDS * 2 ** min(failures - 1, 16), max(self.refresh, RETRY_SECONDS))
        tokens = previous.tokens if previous is not None else None
        self._known.put(key, _Known(tokens, answer.locked, now + back_off, failures))
        if failures == 1 and not self.client.reached:
            logger.warning(
                "Could not reach the upstream to ask for model %r's context window; asking again in %d s. Check the"
                " upstream setting and that the upstream is up.",
                shown(model),
                back_off,
            )
            return
        if failures == 1 and not answer.locked:
            fallback = self.windows.resolve_window(model, None, b"")
            if fallback is not None and fallback.source is WindowSource.TABLE:
                logger.info(
                    "The upstream reported no context window for model %r; the shipped table's %d tokens are used,"
                    " and it is asked again in %d s.",
                    shown(model),
                    fallback.tokens,
                    back_off,
                )
                return
            logger.info(
                "The upstream reported no context window for model %r; asking again in %d s. Set context_windows for"
                " it, or window_probes to [] if this upstream never reports windows.",
                shown(model),
                back_off,
            )
