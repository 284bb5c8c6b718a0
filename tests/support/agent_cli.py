"""An agent's own CLI (Codex CLI, Claude Code) in a test: found where `.ci/run` installs it, run with no stdin, in its
own process group, under a time limit."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

TIMEOUT_SECONDS = 300
"""Far beyond what a session takes: only a hung CLI meets it, and the test then fails instead of hanging."""


def installed_cli(name: str, folder: str, binary: str, override: str) -> Path:
    """`node_modules/.bin/<binary>` in `~/.cache/compaction-proxy/<folder>` (the environment variable `override` names
    another path); skips when it is not there, and fails under CI, which installs it.

    :param name: What the skip reason calls it: the root conftest maps that name to the install command.
    """
    cache = Path(os.environ.get("COMPACTION_PROXY_CACHE", Path.home() / ".cache" / "compaction-proxy"))
    path = Path(os.environ.get(override, cache / folder / "node_modules" / ".bin" / binary))
    if path.is_file() and os.access(path, os.X_OK):
        return path
    reason = f"{name} is not installed at {path}"
    if os.environ.get("CI"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


async def run_cli(command: Sequence[str], cwd: Path, env: Mapping[str, str]) -> tuple[int, str, str]:
    """Run `command` in `cwd` with exactly `env`; its exit code, stdout and stderr.

    Its stdin is empty (both CLIs read a piped stdin as more prompt). It runs in a process group of its own, killed
    whole on the time limit or when the test is cancelled: a node launcher and the native binary it starts die together.
    """
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=cwd,
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), TIMEOUT_SECONDS)
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()
