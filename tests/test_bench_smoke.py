"""The benchmark harnesses still run: each in a tiny configuration, as its own process from the repository root."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import fixed_cost, retention
from bench.run import MESSAGES_API

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "args",
    [
        ["-m", "bench.hook_vs_haystack", "--smoke"],
        ["-m", "bench.resend", "--tokens", "20000", "--repeat", "1"],
        ["-m", "bench.exact_counts", "--tokens", "1000", "--turns", "2"],
        ["-m", "bench.retention", "--smoke"],
        ["-m", "bench.digests", "--smoke"],
        ["-m", "bench.repeated_lines"],
        ["-m", "bench.profile", "--concurrency", "4", "--requests", "40"],
        ["-m", "bench.profile", "--concurrency", "2", "--requests", "2", "--events", "5"],
    ],
    ids=["hook_vs_haystack", "resend", "exact_counts", "retention", "digests", "repeated_lines", "profile", "stream"],
)
def test_bench_runs(args: list[str], tmp_path: Path) -> None:
    """The harness exits 0 (writing its results, where it has an option for it, under `tmp_path`)."""
    if "bench.hook_vs_haystack" in args:
        args = [*args, "--output", str(tmp_path / "hook_vs_haystack.json")]
    if "bench.profile" in args:
        args = [*args, "--output", str(tmp_path / "profile.txt")]
    done = subprocess.run([sys.executable, *args], check=False, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_bench_quick_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    """`python -m bench --quick` runs every part (servers, LiteLLM when installed, load, the Messages API's row,
    memory, the re-sent conversation over sockets and without, long run, hook) and reports."""
    output = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--output", str(output)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "### Added latency over direct calls" in done.stdout
    results = json.loads(output.read_text())
    assert {row["payload"] for row in results["latency"]} == {"small", "very large", MESSAGES_API}
    (messages,) = [
        cell for cell in results["latency_cells"] if (cell["payload"], cell["target"]) == (MESSAGES_API, "proxy")
    ]
    assert set(messages["x_compaction"]) == {"unchanged"}, "the proxy read every Messages API request"
    assert all(not row["problems"] for row in results["latency"]), results["latency"]
    assert [row["rewrite_memory"] for row in results["long_run"]] == [True, False]
    assert all(row["billing"]["direct"]["requests"] > 0 for row in results["long_run"])
    assert "### What the provider bills for the long run" in done.stdout
    assert results["resend"]["resend_ms"] > 0
    assert results["resend_wire"]["x_compaction"] == {"unchanged": results["resend_wire"]["turns"]}
    assert "### Targets (issues 13 and 38) in this run" in done.stdout
    assert "### The fixed cost: the proxy against the bare relay" in done.stdout
    assert set(results["fixed_cost"]) == set(fixed_cost.loops())
    for figures in results["fixed_cost"].values():
        assert all(not row["problems"] for row in [*figures["requests"], figures["events"]]), figures
    assert ("### Against LiteLLM's proxy" in done.stdout) == (results["litellm"] is not None)
    assert results["hook_vs_haystack"]["rows"]
    assert "### What each chain keeps" in done.stdout
    assert {row["chain"] for row in results["retention"]["rows"]} == set(retention.CHAINS)
    assert {row["relay"] for row in results["memory"]} == {"proxy", "bare relay"}


def test_the_dashboard_screenshot_script_writes_a_png(tmp_path: Path) -> None:
    from tests.support.chromium import chromium_or_skip

    chromium_or_skip()
    path = tmp_path / "dashboard.png"
    args = ["-m", "bench.dashboard_screenshot", str(path), "--minutes", "0"]
    done = subprocess.run([sys.executable, *args], check=False, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
