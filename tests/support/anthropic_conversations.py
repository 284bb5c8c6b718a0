"""Random Messages API conversations the strict fake upstream accepts, for property tests (hypothesis).

Each conversation is what an agent would send after talking to `AnthropicUpstream`: a system prompt (text or
blocks), tools, user turns (text, blocks, images), tool-use steps with thinking (signed by the upstream's `Signer`,
bound to their prefix on binding models), parallel calls, server tool blocks, compaction blocks, unknown blocks,
redacted thinking, mid-conversation system messages, the client's own cache breakpoints (at most 3), and often a
final user message of tool results: a turn being continued.
"""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from proxy.simulator.anthropic_rules import Signer, binds, prefix_bytes

MODELS = ("claude-sonnet-4-5", "claude-fable-5-1")
TOOLS: list[dict[str, Any]] = [
    {"name": "read", "description": "Read a file.", "input_schema": {"type": "object", "properties": {}}},
    {"name": "run", "description": "Run a command.", "input_schema": {"type": "object", "properties": {}}},
]
EPHEMERAL = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}


def png(width: int, height: int) -> str:
    """A base64 PNG header of the given size (enough for every reader of its size)."""
    header = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(">II", width, height)
    return base64.b64encode(header + b"\x08\x02\x00\x00\x00" + struct.pack(">I", zlib.crc32(b"IHDR"))).decode()


@dataclass
class Built:
    """A conversation: the request body, ready to send."""

    body: dict[str, Any]

    @property
    def model(self) -> str:
        return str(self.body["model"])


class _Builder:
    def __init__(self, draw: st.DrawFn, signer: Signer, model: str, system: Any) -> None:
        self.draw = draw
        self.signer = signer
        self.body: dict[str, Any] = {"model": model, "max_tokens": 1024, "tools": TOOLS}
        if system is not None:
            self.body["system"] = system
        self.body["thinking"] = {"type": "enabled", "budget_tokens": 512}
        self.messages: list[dict[str, Any]] = []
        self.body["messages"] = self.messages
        self.calls = 0
        self.breakpoints = 1 if isinstance(system, list) and "cache_control" in system[0] else 0
        self.hours = 1 if self.breakpoints and system[0]["cache_control"] == HOUR else 0

    def text(self, prefix: str) -> str:
        return prefix + " " + "lorem ipsum " * self.draw(st.integers(0, 60))

    def mark(self, block: dict[str, Any]) -> dict[str, Any]:
        if self.breakpoints < 3 and self.draw(st.integers(0, 6)) == 0:
            self.breakpoints += 1
            # A longer-lived breakpoint may not follow a shorter one: an hour only while every mark before is one.
            hour = self.hours == self.breakpoints - 1 and self.draw(st.booleans())
            self.hours += hour
            return {**block, "cache_control": HOUR if hour else EPHEMERAL}
        return block

    def user(self, turn: int) -> None:
        kind = self.draw(st.integers(0, 3))
        if kind == 0:
            self.messages.append({"role": "user", "content": self.text(f"task {turn}")})
            return
        blocks: list[dict[str, Any]] = [self.mark({"type": "text", "text": self.text(f"task {turn}")})]
        if kind == 1:
            source = {"type": "base64", "media_type": "image/png", "data": png(800, 600)}
            blocks.append({"type": "image", "source": source})
        self.messages.append({"role": "user", "content": blocks})

    def assistant(self, blocks: list[dict[str, Any]]) -> None:
        """An assistant message as the upstream would have produced it: thinking signed over what came before."""
        signed: list[dict[str, Any]] = []
        model_binds = binds(str(self.body["model"]))
        for block in blocks:
            prefix = prefix_bytes(self.body, self.messages, signed) if model_binds else None
            if block["type"] == "thinking":
                signed.append({**block, "signature": self.signer.sign(block["thinking"], prefix)})
            elif block["type"] == "redacted_thinking":
                signed.append({"type": "redacted_thinking", "data": self.signer.redacted(block["data"], prefix)})
            else:
                signed.append(block)
        self.messages.append({"role": "assistant", "content": signed})

    def step(self, turn: int, think: bool) -> list[str]:
        blocks: list[dict[str, Any]] = []
        if think:
            redacted = self.draw(st.integers(0, 5)) == 0
            kind = "redacted_thinking" if redacted else "thinking"
            payload = {"data": "opaque" * 10} if redacted else {"thinking": self.text(f"thought {turn}")}
            blocks.append({"type": kind, **payload})
        if self.draw(st.booleans()):
            blocks.append(self.mark({"type": "text", "text": self.text("Looking.")}))
        extra = self.draw(st.integers(0, 8))
        if extra == 0:
            blocks.append(
                {"type": "server_tool_use", "id": f"srvtoolu_{self.calls}", "name": "web_search", "input": {}}
            )
            blocks.append({"type": "web_search_tool_result", "tool_use_id": f"srvtoolu_{self.calls}", "content": []})
        elif extra == 1:  # the API's compaction opens the response it happens in
            blocks.insert(0, {"type": "compaction", "content": self.text("Summary of earlier work.")})
        elif extra == 2:
            blocks.append({"type": "mystery_block", "payload": [1, 2, 3]})
        ids = []
        for _ in range(self.draw(st.integers(1, 2))):
            self.calls += 1
            ids.append(f"toolu_{self.calls:04d}")
            blocks.append({"type": "tool_use", "id": ids[-1], "name": "read", "input": {"path": f"f{self.calls}"}})
        self.assistant(blocks)
        return ids

    def results(self, ids: list[str], then_text: bool) -> None:
        blocks: list[dict[str, Any]] = []
        for call_id in ids:
            content: Any = "result " * self.draw(st.integers(0, 300))
            if self.draw(st.integers(0, 4)) == 0:
                content = [{"type": "text", "text": content}]
            blocks.append(self.mark({"type": "tool_result", "tool_use_id": call_id, "content": content}))
        if then_text:
            blocks.append({"type": "text", "text": "Also, keep going."})
        self.messages.append({"role": "user", "content": blocks})


@st.composite
def conversations(draw: st.DrawFn, signer: Signer) -> Built:
    """A conversation the upstream accepts (see the module docstring)."""
    model = draw(st.sampled_from(MODELS))
    marked = {"type": "text", "text": "You are an agent.", "cache_control": EPHEMERAL}
    hour = {**marked, "cache_control": HOUR}
    systems = [None, "You are an agent.", [{"type": "text", "text": "Be brief."}], [marked], [hour]]
    system: Any = draw(st.sampled_from(systems))
    built = _Builder(draw, signer, model, system)
    turns = draw(st.integers(1, 4))
    for turn in range(turns):
        if turn and draw(st.integers(0, 6)) == 0:
            built.messages.append({"role": "system", "content": f"Reminder {turn}."})
        built.user(turn)
        steps = draw(st.integers(0, 3))
        continued = turn == turns - 1 and steps > 0 and draw(st.booleans())
        think = True
        for step in range(steps):
            ids = built.step(turn, think=think)
            last = continued and step == steps - 1
            think = not last and draw(st.integers(0, 5)) == 0
            built.results(ids, then_text=think)
            if last:
                return Built(built.body)
        built.assistant([{"type": "thinking", "thinking": f"done {turn}"}, {"type": "text", "text": "Done."}])
    built.messages.append({"role": "user", "content": "Next."})
    return Built(built.body)


def is_continued(body: Mapping[str, Any]) -> bool:
    """Whether the conversation ends with tool results (a turn being continued)."""
    last = body["messages"][-1]
    content = last.get("content")
    return isinstance(content, list) and bool(content) and content[0].get("type") == "tool_result"
