"""`compaction-proxy count` and `compact`, run as a user runs them: a subprocess, a file or stdin."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.engine import TiktokenCounter


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", *args], input=stdin, capture_output=True, timeout=60, check=False
    )


def long_request() -> dict[str, object]:
    messages: list[dict[str, object]] = [{"role": "system", "content": "You are a careful agent."}]
    for turn in range(12):
        messages.append({"role": "user", "content": f"Question {turn}: " + "tell me more about it. " * 40})
        messages.append({"role": "assistant", "content": "Here is what I know. " * 60})
    messages.append({"role": "user", "content": "And finally, summarize."})
    return {"model": "gpt-4o", "messages": messages}


def test_count_prints_the_tiktoken_count(tmp_path: Path) -> None:
    body = long_request()
    path = tmp_path / "request.json"
    path.write_text(json.dumps(body))
    result = run("count", str(path))
    assert result.returncode == 0, result.stderr
    counter = TiktokenCounter()
    assert int(result.stdout) == counter.messages_tokens(body["messages"]) + counter.overhead_tokens(body)  # type: ignore[arg-type]
    assert b"26 messages" in result.stderr


def test_compact_fits_the_window_and_reports(tmp_path: Path) -> None:
    body = long_request()
    result = run("compact", "-", "--context-window", "4000", stdin=json.dumps(body).encode())
    assert result.returncode == 0, result.stderr
    compacted = json.loads(result.stdout)
    assert compacted["model"] == "gpt-4o"
    assert compacted["messages"][0] == body["messages"][0]  # type: ignore[index]
    assert compacted["messages"][-1] == body["messages"][-1]  # type: ignore[index]
    report = result.stderr.decode()
    assert "strategies: user_message_window" in report and "removed" in report
    counter = TiktokenCounter()
    assert counter.messages_tokens(compacted["messages"]) + 3 <= 0.4 * 4000


def test_compact_under_the_trigger_prints_the_body_unchanged() -> None:
    raw = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode()
    result = run("compact", "-", "--context-window", "128000", stdin=raw)
    assert result.returncode == 0
    assert result.stdout == raw
    assert b"unchanged (under the trigger)" in result.stderr


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["count", "-"], b"{not json", b"not valid JSON"),
        (["count", "-"], b"[1, 2]", b"must be a JSON object"),
        (["count", "-"], b'{"model": "gpt-4o"}', b"no `messages` list"),
        (["count", "-"], b'{"messages": ["hi"]}', b"`messages[0]` must be an object"),
        (["count", "/nonexistent/request.json"], None, b"cannot read"),
        (["compact", "-", "--context-window", "0"], b'{"messages": []}', b"`context_window` must be a positive"),
        (
            ["compact", "-", "--context-window", "100", "--compact-at", "0.3", "--compact-to", "0.5"],
            b"{}",
            b"compact_to (0.5) must be below compact_at (0.3)",
        ),
        (["compact", "-", "--context-window", "100", "--strategies", "bogus"], b"{}", b"unknown strategy bogus"),
        (
            ["compact", "-", "--context-window", "100", "--strategies", "summarization"],
            b"{}",
            b"summarization cannot run offline",
        ),
        (
            ["compact", "-", "--context-window", "100"],
            b'{"messages": [{"role": "wizard", "content": "hi"}]}',
            b"message 0: role 'wizard' is not one of",
        ),
        (
            ["count", "-"],
            b'{"messages": [{"role": "user", "content": 42}]}',
            b"message 0: content must be a string, a list of parts or null, not int",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(args: list[str], stdin: bytes | None, message: bytes) -> None:
    result = run(*args, stdin=stdin)
    assert result.returncode == 2
    assert message in result.stderr
    assert b"Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def _file(step: int) -> str:
    """A file's text: no line repeats (`repeated_lines` would shorten it without pruning)."""
    return "".join(f"line {n} of file {step}\n" for n in range(120))


def test_compact_help_names_the_serve_flag_serve_takes() -> None:
    help_text = run("compact", "--help").stdout.decode()
    assert "serve --offload false" in " ".join(help_text.split())
    refused = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "serve", "--no-offload"], capture_output=True, timeout=60, check=False
    )
    assert refused.returncode == 2  # the flag the help named before is not one `serve` takes


def long_responses_request() -> dict[str, object]:
    items: list[dict[str, object]] = [{"role": "user", "content": "Read every file and report."}]
    for step in range(12):
        items.append({"type": "reasoning", "id": f"rs_{step}", "summary": [], "encrypted_content": "e" * 400})
        items.append({"type": "function_call", "call_id": f"c{step}", "name": "read", "arguments": f'{{"n": {step}}}'})
        items.append({"type": "function_call_output", "call_id": f"c{step}", "output": _file(step)})
    return {"model": "gpt-4o", "instructions": "You are a careful agent.", "input": items}


def test_count_and_compact_take_a_responses_body_too() -> None:
    raw = json.dumps(long_responses_request()).encode()
    counted = run("count", "-", stdin=raw)
    assert counted.returncode == 0, counted.stderr
    assert b"26 messages" in counted.stderr  # the instructions, the user message, 12 steps of a call and its output
    result = run("compact", "-", "--context-window", "8000", stdin=raw)
    assert result.returncode == 0, result.stderr
    compacted = json.loads(result.stdout)
    assert compacted["instructions"] == "You are a careful agent."
    items = compacted["input"]
    assert items[0] == {"role": "user", "content": "Read every file and report."}
    calls = {item["call_id"] for item in items if item.get("type") == "function_call"}
    outputs = {item["call_id"] for item in items if item.get("type") == "function_call_output"}
    assert calls == outputs and "c11" in calls
    assert int(counted.stdout) > 0.7 * 8000
    assert b"tool_result_pruning" in result.stderr


def codex_compaction_request(words: int) -> bytes:
    """Codex's own compaction request: its history, then its compact prompt as the last user message."""
    prompt = "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for another LLM."
    items: list[dict[str, object]] = [{"role": "developer", "content": "You are Codex."}]
    for step in range(6):
        items.append({"type": "function_call", "call_id": f"c{step}", "name": "shell", "arguments": "{}"})
        items.append({"type": "function_call_output", "call_id": f"c{step}", "output": "line " * words})
    items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]})
    return json.dumps({"model": "gpt-4o", "input": items}).encode()


@pytest.mark.parametrize(
    ("words", "policy", "report"),
    [
        (1000, None, b"unchanged (deferred to the client's own compaction: compaction-request)"),
        (1000, "ignore", b"strategies:"),
        (1500, None, b"strategies:"),
    ],
)
def test_compact_defers_to_a_client_compaction_request_unless_it_would_not_fit(
    words: int, policy: str | None, report: bytes
) -> None:
    raw = codex_compaction_request(words)
    flags = ["--client-compaction", policy] if policy else []
    result = run("compact", "-", "--context-window", "8000", *flags, stdin=raw)
    assert result.returncode == 0, result.stderr
    assert report in result.stderr
    assert (result.stdout == raw) == report.startswith(b"unchanged")


def anthropic_request() -> dict[str, object]:
    """A Messages API body: a top-level `system`, block content, tools in Anthropic's shape."""
    messages: list[dict[str, object]] = []
    for turn in range(12):
        messages.append({"role": "user", "content": [{"type": "text", "text": f"Q{turn}: " + "tell me more. " * 60}]})
        messages.append({"role": "assistant", "content": "Here is what I know. " * 60})
    messages.append({"role": "user", "content": "And finally, summarize."})
    tools = [{"name": "search", "description": "Search.", "input_schema": {"type": "object", "properties": {}}}]
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "system": "Be careful.",
        "tools": tools,
        "messages": messages,
    }


def test_a_messages_api_body_is_counted_and_compacted_in_its_own_shape() -> None:
    raw = json.dumps(anthropic_request()).encode()
    counted = run("count", "-", stdin=raw)
    assert counted.returncode == 0, counted.stderr
    assert b"26 messages" in counted.stderr, "the system prompt is one message, each turn another"
    result = run("compact", "-", "--context-window", "4000", stdin=raw)
    assert result.returncode == 0, result.stderr
    compacted = json.loads(result.stdout)
    assert compacted["system"] == "Be careful." and compacted["tools"][0]["name"] == "search"
    assert compacted["messages"][-1] == {"role": "user", "content": "And finally, summarize."}
    assert len(compacted["messages"]) < 25
