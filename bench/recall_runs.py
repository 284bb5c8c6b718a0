"""One conversation through the real proxy, turn by turn, in front of its format's fake upstream, scored.

The proxy is the aiohttp app with the real compaction pipeline on a loopback port (`tests.support.proxies`); a row
gives its settings, or a chain of strategies the registry does not know (the baselines), which the pipeline runs
in place of the one its settings name. The client posts each request with plain aiohttp and stops at the first that
fails.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.recall_conversations import Conversation
from bench.recall_scoring import Score, references, score
from bench.recall_wire import Wire, script
from proxy.engine import CompactionChain
from tests.support.proxies import LoopbackProxies

KEY = "sk-recall"
"""The client's API key: its tenant is where the proxy keeps what it offloaded."""


@dataclass(frozen=True)
class Row:
    """A way of compacting: proxy settings by name, or a chain the pipeline runs instead of the one they name.

    :param label: How the report names it.
    :param chain: Makes a fresh chain for each run (a baseline's strategies).
    """

    label: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    chain: Callable[[], CompactionChain] | None = None


class RunFailed(RuntimeError):
    """A request of the run was answered with an error."""


async def run(row: Row, conversation: Conversation, wire: Wire, window: int) -> Score:
    """Send every request of `conversation` in `wire` through a fresh proxy for `row`; score what reached upstream.

    :param window: The model's context window, which the proxy is told and the upstream enforces.
    """
    decisions: list[str] = []
    async with wire.upstream(window) as upstream:
        wire.install(upstream, script(conversation))
        proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={wire.case.model: window})
        try:
            proxy = await proxies.start(row.chain() if row.chain else None, **row.settings)
            for n in conversation.calls():
                status, headers, answer = await wire.case.post(proxy, wire.body(conversation, n), key=KEY)
                if status != 200:
                    raise RunFailed(f"{row.label}, {conversation.name}, {wire.name}, call {n}: {status} {answer}")
                decisions.append(headers.get("X-Compaction", ""))
            bodies = wire.case.forwarded(upstream)
            tenant = bytes.fromhex(proxy.settings.tenant_of(wire.case.credentials(KEY)))
            held = [await proxy.service.store.offloaded(tenant, reference) for reference in references(bodies[-1])]
        finally:
            await proxies.close()
        return score(
            wire.case,
            facts=conversation.facts,
            bodies=bodies,
            usages=wire.usages(upstream),
            decisions=decisions,
            offloaded=[text for text in held if text is not None],
        )
