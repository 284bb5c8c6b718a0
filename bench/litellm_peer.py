"""LiteLLM's proxy as a peer in the latency table, when it is installed in a virtual environment of its own.

LiteLLM is never a dependency of ours: the bench looks for its `litellm` command in `COMPACTION_BENCH_LITELLM`, else
in `~/.cache/compaction-proxy/litellm-venv/bin/litellm`, and leaves the peer out with a note saying how to install it
when there is none. It runs in front of the same instant upstream as everything else, with one model routed to it,
a master key of the bench's own, and the model cost map read from its package (it fetches nothing at start-up).
"""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path

import yaml

from bench.payloads import MODEL
from bench.processes import Server

VENV = Path.home() / ".cache" / "compaction-proxy" / "litellm-venv"
ENV_VAR = "COMPACTION_BENCH_LITELLM"
INSTALL = f"python3 -m venv {VENV} && {VENV}/bin/pip install 'litellm[proxy]'"
"""The command that installs LiteLLM where the bench looks for it."""

START_SECONDS = 120.0
"""LiteLLM's proxy takes several seconds to import and start."""


def command() -> Path | None:
    """The `litellm` command to run, or None when it is not installed."""
    configured = os.environ.get(ENV_VAR)
    path = Path(configured) if configured else VENV / "bin" / "litellm"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def absent_note() -> str:
    """What the report says when LiteLLM is not installed."""
    return f"LiteLLM's proxy is not installed, so it is not in the table; to add it: `{INSTALL}` (or set {ENV_VAR})."


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_litellm(litellm: Path, workdir: Path, upstream: str) -> Server:
    """LiteLLM's proxy (not yet started) routing `MODEL` to `upstream`; its `client_headers` carry the master key."""
    key = "sk-bench-" + secrets.token_hex(16)
    config = workdir / "litellm.yaml"
    route = {"model": f"openai/{MODEL}", "api_base": f"{upstream}/v1", "api_key": "sk-bench"}
    config.write_text(yaml.safe_dump({"model_list": [{"model_name": MODEL, "litellm_params": route}]}))
    port = _free_port()
    return Server(
        "litellm",
        [str(litellm), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
        workdir,
        env={"LITELLM_MASTER_KEY": key, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        url=f"http://127.0.0.1:{port}",
        health_path="/health/liveliness",
        start_timeout=START_SECONDS,
        client_headers={"Authorization": f"Bearer {key}"},
    )
