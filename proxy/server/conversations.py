"""The dashboard's per-conversation data: the recent conversations, and one conversation's records, as JSON.

`GET /dashboard/conversations.json` lists the conversations the ledger keeps (`proxy.pipeline.ledger`), the most
recently seen first, each with its totals and its bill, and the `total` of their bills; `GET
/dashboard/conversations/{id}.json` gives one with its records and its bill (`proxy.server.bills`). No
content is in either: conversations, tenants are named by hashes. Both sit behind the proxy keys and the `dashboard`
switch, like `/dashboard.json`: off, they answer 404 and say how to turn the dashboard on.
"""

from __future__ import annotations

import re
from typing import Any, Final, Protocol

from aiohttp import web

from proxy.pipeline.ledger import LedgerRecord
from proxy.server import errors
from proxy.server.bills import TOTAL, billed
from proxy.server.dashboard import SECURITY_HEADERS, dashboard_off
from proxy.server.keys import COMPACTION, SETTINGS

LIST_PATH: Final = "/dashboard/conversations.json"
ONE_PATH: Final = "/dashboard/conversations/{conversation}.json"
_ID: Final = re.compile(r"[0-9a-f]{1,64}")


class Conversations(Protocol):
    """What the compaction side's ledger answers (`proxy.pipeline.ledger.Ledger`)."""

    max_conversations: int
    max_requests: int

    def recent(self) -> list[dict[str, Any]]:
        """The conversations kept, most recently seen first, without their records."""
        ...

    def conversation(self, conversation_id: str) -> dict[str, Any] | None:
        """One conversation with its records, or None."""
        ...

    def records(self, conversation_id: str | None = None) -> dict[str, tuple[LedgerRecord, ...]]:
        """The kept records of every conversation, or of one, by id (what the bills read)."""
        ...


def add_routes(app: web.Application) -> None:
    """Register the two JSON paths (GET and HEAD)."""
    app.router.add_get(LIST_PATH, listing)
    app.router.add_get(ONE_PATH, one)


def _ledger(request: web.Request) -> Conversations | None:
    """The compaction side's ledger, when the dashboard is on and the compaction side keeps one."""
    if not request.app[SETTINGS].dashboard:
        return None
    ledger = getattr(request.app[COMPACTION], "ledger", None)
    return ledger if ledger is not None and callable(getattr(ledger, "recent", None)) else None


async def listing(request: web.Request) -> web.Response:
    """The recent conversations and the ledger's bounds."""
    ledger = _ledger(request)
    if ledger is None:
        return dashboard_off()
    limits = {"conversations": ledger.max_conversations, "requests": ledger.max_requests}
    listed = ledger.recent()
    bills = await billed(request.app, ledger.records())
    for conversation in listed:
        conversation["bill"] = bills[conversation["id"]]
    listing = {"conversations": listed, "total": bills[TOTAL], "limits": limits}
    return web.json_response(listing, headers=SECURITY_HEADERS)


async def one(request: web.Request) -> web.Response:
    """One conversation with its records; 404 (OpenAI-style) for an id the ledger does not keep."""
    ledger = _ledger(request)
    if ledger is None:
        return dashboard_off()
    conversation_id = request.match_info["conversation"]
    found = ledger.conversation(conversation_id) if _ID.fullmatch(conversation_id) else None
    if found is None:
        return errors.error_response(
            404,
            "No such conversation is kept: it may be older than the ledger keeps; see /dashboard/conversations.json.",
            type_="invalid_request_error",
            code="conversation_not_found",
        )
    bills = await billed(request.app, ledger.records(conversation_id))
    return web.json_response({**found, "bill": bills[conversation_id]}, headers=SECURITY_HEADERS)
