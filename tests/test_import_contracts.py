"""The layering declared in pyproject.toml's import-linter contracts holds, and the contracts catch an upward import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def lint_imports(project: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` over the packages in `project`, with its pyproject.toml's contracts."""
    env = {**os.environ, "PYTHONPATH": str(project), "COLUMNS": "400"}
    command = [sys.executable, "-c", LINT_IMPORTS, "--no-cache", str(project / "pyproject.toml")]
    return subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, check=False)


def test_the_code_keeps_every_import_contract() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "upward_import", "contract"),
    [
        ("proxy/engine/plan.py", "import aiohttp", "The engine imports no other part"),
        ("proxy/engine/plan.py", "import proxy.pipeline.service", "The engine imports no other part"),
        ("hooks/compaction/hook.py", "import proxy.state.redis", "The Haystack hook imports the engine"),
        ("proxy/pipeline/service.py", "import proxy.server.app", "A request's layers import only downwards"),
        ("proxy/pipeline/outgoing.py", "import proxy.formats.responses.stateful", "A request's layers import only"),
        ("proxy/formats/responses/items.py", "import proxy.server.relay", "A request's layers import only downwards"),
        ("proxy/server/app.py", "import proxy.cli", "A request's layers import only downwards"),
        ("proxy/state/memory.py", "import proxy.pipeline.offload.reads", "Window discovery, state stores and settings"),
        ("proxy/discovery/service.py", "import proxy.formats.responses", "Window discovery, state stores and settings"),
        ("proxy/pipeline/service.py", "import proxy.simulator", "The request path never imports the simulated"),
        ("proxy/server/accounting.py", "import opentelemetry.trace", "OpenTelemetry is imported by its exporter"),
    ],
)
def test_an_upward_import_breaks_its_contract(tmp_path: Path, module: str, upward_import: str, contract: str) -> None:
    for package in ("proxy", "hooks"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / module
    path.write_text(path.read_text() + f"\n{upward_import}  # noqa\n")

    result = lint_imports(tmp_path)

    assert result.returncode != 0
    broken = [line for line in result.stdout.splitlines() if " BROKEN" in line]
    assert len(broken) >= 1
    assert any(line.startswith(contract) for line in broken), result.stdout
