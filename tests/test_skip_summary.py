"""A test run ends by naming what it skipped and the command that enables it (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def skip_summary_without_tools(test_file: str) -> str:
    """Run `test_file` with only the interpreter's own directory on PATH (no redis-server, no chromium, as on a fresh
    machine) and return the run's skip summary."""
    environment = {name: value for name, value in os.environ.items() if name != "CI"}
    environment["PATH"] = str(Path(sys.executable).parent)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout[result.stdout.index("skipped, and how to run them") :]


def test_a_run_without_redis_server_names_the_skip_and_how_to_enable_it() -> None:
    summary = skip_summary_without_tools("tests/state/test_readiness.py")
    assert "3 skipped: redis-server is not installed" in summary
    assert "    to run them: apt-get install redis-server" in summary
    assert "To run everything, as CI does: bash .ci/run" in summary
    assert summary.count("redis-server is not installed") == 1  # each reason once


def test_a_run_without_chromium_names_the_skip_and_how_to_enable_it() -> None:
    summary = skip_summary_without_tools("tests/e2e/test_dashboard.py")
    assert "2 skipped: chromium not installed (Debian's package): apt-get install chromium" in summary
    assert "    to run them: apt-get install chromium" in summary
