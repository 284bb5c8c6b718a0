"""A Codex-shaped client: a `store: false` Responses agent loop that compacts its own history, as Codex CLI does.

What it sends is what Codex CLI sends on the wire (`codex-rs/core`): its base prompt and skills as leading
`developer` items (no `instructions`), its environment as a user message, the task, then every response's output
items and the function call outputs, whole, on every request; with Codex's headers (`originator: codex_cli_rs`, a
`User-Agent` of `codex_cli_rs/...`) unless told otherwise.

It compacts itself as Codex does (`run_inline_auto_compact_task`): once a response's reported usage (input plus
output tokens) reaches `auto_compact_tokens`, it sends its whole history plus one user message, Codex's compact
prompt, and rebuilds its history from the answer: the initial context, the user messages it sent, and the summary
behind Codex's summary prefix.

`compacting_responder` is the model side: it writes a handoff summary when asked with that prompt, and drives the
tool loop otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp

from proxy.simulator.responses_api import ResponsesReply, ResponsesResponder, responses_tool_loop_responder
from proxy.simulator.responses_items import item_type

COMPACT_PROMPT: Final = (
    "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for another LLM that will resume"
    " the task.\n\nInclude:\n- Goal / user objective\n- Current progress and key decisions made\n- What remains to"
    " be done (clear next steps)\n\nBe concise, structured, and focused on helping the next LLM seamlessly continue"
    " the work.\n"
)
SUMMARY_PREFIX: Final = (
    "Another language model started to solve this problem and produced a summary of its thinking process. Use this"
    " to build on the work that has already been done and avoid duplicating work. Here is the summary:"
)
CODEX_HEADERS: Final = {"originator": "codex_cli_rs", "User-Agent": "codex_cli_rs/0.58.0 (Ubuntu 24.4.0; x86_64)"}
TOOLS: Final[list[dict[str, Any]]] = [
    {
        "type": "function",
        "name": "shell",
        "description": "Runs a shell command and returns its output.",
        "strict": False,
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    }
]


def compacting_responder() -> ResponsesResponder:
    """The model: a handoff summary for a request whose last item is the compact prompt, else the `shell` loop."""
    loop = responses_tool_loop_responder("shell", steps=100_000, reasoning=False)
    summaries = 0

    def respond(request: dict[str, Any]) -> ResponsesReply:
        nonlocal summaries
        items = request["input"]
        last = items[-1] if items else {}
        if item_type(last) == "message" and _text(last).startswith(COMPACT_PROMPT[:40]):
            summaries += 1
            return ResponsesReply(text=f"Handoff {summaries}: ran the commands so far; next, run the rest.")
        return loop(request)

    return respond


@dataclass(frozen=True)
class Exchange:
    """One request the client sent, and what came back."""

    body: dict[str, Any]
    status: int
    headers: Mapping[str, str]
    answer: dict[str, Any]
    compaction: bool

    @property
    def used_tokens(self) -> int:
        """Input plus output tokens the answer reported (what Codex compares with its limit)."""
        usage = self.answer.get("usage") or {}
        return int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0))


@dataclass
class CodexShapedClient:
    """The agent loop (see the module docstring).

    :param url: The OpenAI base URL (`.../v1`).
    :param model: The model asked for.
    :param auto_compact_tokens: The usage at which the client compacts itself.
    :param output_words: The words of a `shell` output, given the usage the response that called it reported.
    :param headers: Sent with every request besides the credentials.
    :param websocket: Speak the Responses API's WebSocket mode, as Codex CLI does first: one socket to
        `/responses` for the whole run, each request a `response.create` message, each answer read from its
        events (`Exchange.headers` is then empty: a message has none). `sockets` counts the sockets opened.
    """

    url: str
    model: str
    auto_compact_tokens: int
    output_words: Callable[[int], int] = lambda _used: 300
    headers: Mapping[str, str] = field(default_factory=lambda: dict(CODEX_HEADERS))
    exchanges: list[Exchange] = field(default_factory=list)
    initial: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    websocket: bool = False
    sockets: int = 0
    _socket: aiohttp.ClientWebSocketResponse | None = None

    def __post_init__(self) -> None:
        base = "You are Codex, a coding agent. " + "Follow the repository's conventions and explain changes. " * 120
        skills = "## Skills\n" + "- skill: run tests before committing; keep diffs small.\n" * 40
        environment = "<environment_context><cwd>/repo</cwd><shell>bash</shell></environment_context>"
        self.initial = [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": base}]},
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": skills}]},
            _user(environment),
        ]
        self.history = [*self.initial, _user("Fix the failing tests in the repository.")]

    async def run(self, turns: int) -> None:
        """Send `turns` requests of the loop (its own compaction requests not counted)."""
        async with aiohttp.ClientSession() as session:
            if self.websocket:
                self._socket = await session.ws_connect(self.url + "/responses", headers=self._headers())
                self.sockets += 1
            try:
                await self._loop(session, turns)
            finally:
                if self._socket is not None:
                    await self._socket.close()

    async def _loop(self, session: aiohttp.ClientSession, turns: int) -> None:
        for _ in range(turns):
            exchange = await self._send(session, self.history, compaction=False)
            if exchange.status != 200:
                return
            self._carry(exchange)
            if exchange.used_tokens >= self.auto_compact_tokens and not await self._compact(session):
                return

    def _carry(self, exchange: Exchange) -> None:
        """Append the response's output and run the calls it made."""
        output = exchange.answer["output"]
        self.history.extend(output)
        for item in output:
            if item_type(item) == "function_call":
                words = self.output_words(exchange.used_tokens)
                result = {"type": "function_call_output", "call_id": item["call_id"], "output": "line " * words}
                self.history.append(result)

    async def _compact(self, session: aiohttp.ClientSession) -> bool:
        """Codex's own compaction: ask for a handoff summary and start over from it."""
        exchange = await self._send(session, [*self.history, _user(COMPACT_PROMPT)], compaction=True)
        if exchange.status != 200:
            return False
        summary = "".join(_text(item) for item in exchange.answer["output"] if item_type(item) == "message")
        asked = [item for item in self.history[len(self.initial) :] if _is_user(item)]
        kept = [item for item in asked if not _text(item).startswith(SUMMARY_PREFIX)]
        self.history = [*self.initial, *kept, _user(f"{SUMMARY_PREFIX}\n{summary}")]
        return True

    async def _send(self, session: aiohttp.ClientSession, items: list[dict[str, Any]], *, compaction: bool) -> Exchange:
        body = {"model": self.model, "input": list(items), "tools": TOOLS, "store": False, "parallel_tool_calls": False}
        if self._socket is not None:
            exchange = await self._over_socket(self._socket, body, compaction)
        else:
            async with session.post(self.url + "/responses", json=body, headers=self._headers()) as response:
                exchange = Exchange(body, response.status, dict(response.headers), await response.json(), compaction)
        self.exchanges.append(exchange)
        return exchange

    async def _over_socket(
        self, socket: aiohttp.ClientWebSocketResponse, body: dict[str, Any], compaction: bool
    ) -> Exchange:
        """Send `body` as a `response.create` message; read events until the response's last one."""
        await socket.send_json({"type": "response.create", **body})
        while True:
            message = await socket.receive()
            if message.type is not aiohttp.WSMsgType.TEXT:
                raise ConnectionError(f"the socket ended mid-response: {message.type.name} {message.data}")
            event = json.loads(message.data)
            if event["type"] in ("response.completed", "response.incomplete", "response.failed"):
                return Exchange(body, 200, {}, event["response"], compaction)
            if event["type"] == "error":
                return Exchange(body, int(event.get("status", 400)), {}, event, compaction)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": "Bearer sk-codex", **self.headers}


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _is_user(item: Mapping[str, Any]) -> bool:
    return item_type(item) == "message" and item.get("role") == "user"


def _text(item: Mapping[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content or () if isinstance(part, Mapping))
