"""The benchmark harnesses still run: each in a tiny configuration, as its own process from the repository root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "args",
    [
        ["-m", "bench.hook_vs_haystack", "--smoke"],
        ["-m", "bench.resend", "--tokens", "20000", "--repeat", "1"],
    ],
    ids=["hook_vs_haystack", "resend"],
)
def test_bench_runs(args: list[str], tmp_path: Path) -> None:
    """The harness exits 0 (writing its results, where it has an option for it, under `tmp_path`)."""
    if "bench.hook_vs_haystack" in args:
        args = [*args, "--output", str(tmp_path / "hook_vs_haystack.json")]
    done = subprocess.run([sys.executable, *args], check=False, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
