"""Codex CLI signed in with ChatGPT, offline: the `auth.json` its sign-in writes, and chatgpt.com's account service.

After `codex login` with a ChatGPT account, Codex keeps the OAuth tokens in `$CODEX_HOME/auth.json`; it reads the
account id and plan from the id token's claims (under `https://api.openai.com/auth`; the signature is not its to check)
and refreshes the tokens over the network only once `last_refresh` is days old, so a fresh one keeps it offline.

Before its first model request, Codex (0.171) asks `<chatgpt_base_url>/wham/accounts/check` which backend serves the
account's workspace, and accepts only an HTTPS origin there (a plain `http://` `chatgpt_base_url` fails every turn
with "workspace backend must use an HTTPS origin without credentials"). `ChatGPTAccounts` stands in for that service:
loopback HTTPS with a test CA (Codex trusts it through `CODEX_CA_CERTIFICATE`), answering the account check for the
one account and 404 for the rest (plugins, analytics, connectors), which Codex tolerates. Its model traffic does not
go there: it follows `openai_base_url`, which is the proxy.
"""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Final, NamedTuple

from aiohttp import web

from tests.support.private_ca import ServerCertificate

ACCOUNT_ID: Final = "acct-compaction-proxy-test"
PLAN: Final = "pro"
ACCESS_TOKEN_DAYS: Final = 10
AUTH_CLAIMS: Final = "https://api.openai.com/auth"


def _segment(value: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()


def token(claims: dict[str, Any]) -> str:
    """A JWT carrying `claims`, issued now and valid `ACCESS_TOKEN_DAYS` days, with a signature nobody checks."""
    issued = int(time.time())
    payload = {"iat": issued, "exp": issued + ACCESS_TOKEN_DAYS * 86_400, **claims}
    return ".".join((_segment({"alg": "RS256", "typ": "JWT"}), _segment(payload), _segment({"signature": "none"})))


def write_chatgpt_login(home: Path, account_id: str = ACCOUNT_ID) -> str:
    """Write `home/auth.json` as Codex's ChatGPT sign-in does, for `account_id` on the `PLAN` plan, refreshed now.

    :returns: The access token Codex sends as its bearer.
    """
    account = {"chatgpt_account_id": account_id, "chatgpt_plan_type": PLAN, "chatgpt_user_id": "user-test"}
    access = token({AUTH_CLAIMS: account})
    login = {
        "auth_mode": "chatgpt",
        "OPENAI_API_KEY": None,
        "tokens": {
            "id_token": token({"email": "dev@example.com", AUTH_CLAIMS: account}),
            "access_token": access,
            "refresh_token": "rt-test-never-used",
            "account_id": account_id,
        },
        "last_refresh": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
    }
    (home / "auth.json").write_text(json.dumps(login))
    return access


class Seen(NamedTuple):
    """A request the account service received: its method, path and `ChatGPT-Account-ID` header."""

    method: str
    path: str
    account: str | None


class ChatGPTAccounts:
    """chatgpt.com's account service on loopback HTTPS, for one account (see the module docstring).

    :param certificate: The server certificate it presents (for 127.0.0.1, from a test CA).
    """

    def __init__(self, certificate: ServerCertificate, account_id: str = ACCOUNT_ID) -> None:
        self.certificate = certificate
        self.account_id = account_id
        self.requests: list[Seen] = []
        self._runner: web.AppRunner | None = None
        self.base_url = ""
        """Codex's `chatgpt_base_url`: `https://127.0.0.1:<port>/backend-api/`, once started."""

    async def _answer(self, request: web.Request) -> web.Response:
        self.requests.append(Seen(request.method, request.path, request.headers.get("ChatGPT-Account-ID")))
        if request.path == "/backend-api/wham/accounts/check":
            entry = {
                "id": self.account_id,
                "plan_type": PLAN,
                "structure": "personal",
                "workspace_backend_origin": "NO_CONSTRAINT",
                "account_routing_override": "NO_CONSTRAINT",
            }
            return web.json_response({"accounts": [entry]})
        return web.json_response({"detail": "Not Found"}, status=404)

    async def __aenter__(self) -> ChatGPTAccounts:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.certificate.server_context())
        await site.start()
        self.base_url = f"https://127.0.0.1:{self._runner.addresses[0][1]}/backend-api/"
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
