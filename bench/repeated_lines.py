"""How much of a tool result `repeated_lines` removes, losslessly, on real command output.

    python -m bench.repeated_lines [--output FILE]

The samples in `bench/samples/` were captured from real commands (paths shortened): `ci_job.log`, a CI job waiting for
its services (`pg_isready`, `redis-cli` in retry loops), a pytest run printing a deprecation warning for every test
(`-W always`), and a fetch retried with its traceback logged each time; `build.log`, a `pip install` resolving
dependencies (little repeats there). Two results of `bench.retention`'s agent (a test log, a file read) are the
controls: nothing repeats in them, and nothing may be removed. Tokens are counted with o200k_base.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bench.publish import published
from bench.retention import _Agent
from proxy.engine import TiktokenCounter
from proxy.engine.strategies.repeated_lines import collapsed

SAMPLES = Path(__file__).parent / "samples"


def samples() -> dict[str, str]:
    """Each sample's text, by name."""
    agent = _Agent(1)
    controls = {
        "bench.retention test log (control)": agent._result("run_tests", {}),
        "bench.retention file read (control)": agent._result("read_file", {"path": "orders/handler.py"}),
    }
    return {**{path.name: path.read_text() for path in sorted(SAMPLES.glob("*.log"))}, **controls}


def run() -> dict[str, Any]:
    """Tokens before and after `collapsed`, per sample and in total."""
    counter = TiktokenCounter()
    rows = []
    for name, text in samples().items():
        written = collapsed(text) or text
        rows.append(
            {
                "sample": name,
                "lines": text.count("\n") + 1,
                "tokens_before": counter.text_tokens(text),
                "tokens_after": counter.text_tokens(written),
            }
        )
    return {"rows": rows}


def render(results: dict[str, Any]) -> list[str]:
    """The markdown table."""
    lines = [
        "### Repeated lines written once (`bench.repeated_lines`, real command output)",
        "",
        "| sample | lines | tokens before | tokens after | removed |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in results["rows"]:
        removed = 1 - row["tokens_after"] / row["tokens_before"]
        lines.append(
            f"| {row['sample']} | {row['lines']} | {row['tokens_before']} | {row['tokens_after']} | {removed:.1%} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the table; write the JSON results when asked."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, help="write the JSON results here")
    args = parser.parse_args(argv)
    results = run()
    return published(render(results), results, args.output)


if __name__ == "__main__":
    sys.exit(main())
