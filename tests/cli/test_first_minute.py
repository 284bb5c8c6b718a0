"""The README's first minute runs as written: in a fresh venv on a copy of the clone, its commands install the package
and start `compaction-proxy demo`, which prints what the README shows and leaves the dashboard answering.

The commands run exactly as the README's block gives them; only the proxy's port differs (the environment's
`COMPACTION_PROXY_PORT=0`, as 8080 may be taken on a shared machine), so the printed addresses carry the port chosen.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import aiohttp

from tests.cli.test_five_minutes import ROOT, block

HEADING = "## Try it in a minute"


def clone(into: Path) -> None:
    """Copy the repository's tracked files as they are in the working tree: what a fresh clone of it would hold."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        if (ROOT / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, into / name)


async def printed_until(stream: asyncio.StreamReader, last: str) -> list[str]:
    """The lines `stream` gives up to and including `last` (the demo then waits for Ctrl-C)."""
    lines: list[str] = []
    while not lines or lines[-1] != last:
        line = await stream.readline()
        assert line, "the commands ended before the demo said it keeps running:\n" + "\n".join(lines[-20:])
        lines.append(line.decode().rstrip("\n"))
    return lines


def compacted(figures: list[dict[str, Any]]) -> float:
    """Requests the dashboard's "what compaction did" figure counts as compacted."""
    (decisions,) = [figure for figure in figures if figure["id"] == "decisions"]
    return sum(sum(series["values"]) for series in decisions["series"] if series["name"].endswith(" compacted"))


async def test_the_commands_install_the_package_and_the_demo_shows_what_the_readme_says(tmp_path: Path) -> None:
    commands = block("bash", HEADING)
    shown = block("text", HEADING).splitlines()
    assert commands.splitlines()[-1] == "compaction-proxy demo"
    clone(tmp_path)
    environment = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
    environment |= {"COMPACTION_PROXY_PORT": "0"}
    with (tmp_path / "stderr").open("wb") as errors:
        process = await asyncio.create_subprocess_exec(
            "bash", "-c", commands, cwd=tmp_path, env=environment, stdout=asyncio.subprocess.PIPE, stderr=errors,
            start_new_session=True,
        )  # fmt: skip
    try:
        assert process.stdout is not None
        lines = await asyncio.wait_for(printed_until(process.stdout, "Ctrl-C stops them."), timeout=900)
        dashboard = next(line.split()[-1] for line in lines if line.startswith("  dashboard: "))
        port = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/dashboard", dashboard)
        assert port is not None, dashboard
        expected = [line.replace(":8080", f":{port.group(1)}") for line in shown]
        assert [line for line in expected if line not in lines] == []
        async with aiohttp.ClientSession() as http, http.get(dashboard + ".json") as response:
            assert response.status == 200
            figures = (await response.json())["figures"]
        (requests,) = [figure for figure in figures if figure["id"] == "requests"]
        assert sum(item["value"] for item in requests["items"]) == 40  # the demo's 40 turns
        assert compacted(figures) == sum(" compacted " in line for line in shown) == 2
    finally:
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C, as the README says
        returncode = await process.wait()
    assert returncode == 0, (tmp_path / "stderr").read_text()[-2000:]
