"""A real redis-server for the state tests, started by the tests themselves, and stores to run the contract on.

The server listens on a free loopback port with a throw-away directory and no persistence. Without `redis-server`
the Redis tests skip, unless `CI` is set: CI installs it (`.ci/run`), so there a missing server is a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from proxy.state import MemoryStore, StateStore
from proxy.state.redis import RedisStore

STARTUP_DEADLINE_SECONDS = 10.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stop a redis-server: SIGTERM, then SIGKILL if it has not exited within 5 seconds."""
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _start(binary: str, directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start redis-server on a free port and wait (bounded) until it answers PING."""
    port = _free_port()
    process = subprocess.Popen(
        [
            *(binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"),
            *("--dir", str(directory), "--daemonize", "no", "--loglevel", "warning"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + STARTUP_DEADLINE_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited: {process.stderr.read().decode() if process.stderr else ''}")
        try:
            with redis.Redis.from_url(url, socket_connect_timeout=0.2) as client:
                client.ping()
            return process, url
        except redis.ConnectionError:
            time.sleep(0.02)
    process.kill()
    raise RuntimeError("redis-server did not answer within the deadline")


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a redis-server these tests started (and stop at the end of the session)."""
    binary = shutil.which("redis-server")
    if binary is None:
        reason = "redis-server is not installed (apt-get install redis-server; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}, and CI is set: the Redis store must be tested in CI")
        pytest.skip(reason)
    for attempt in range(3):
        try:
            process, url = _start(binary, tmp_path_factory.mktemp(f"redis{attempt}"))
            break
        except RuntimeError:
            if attempt == 2:
                raise
    try:
        yield url
    finally:
        _stop(process)


@pytest.fixture
async def redis_store(redis_url: str) -> AsyncIterator[RedisStore]:
    """A RedisStore with a key prefix of its own, so tests sharing the server never see each other's keys."""
    store = RedisStore(redis_url, ttl_seconds=60, key_prefix=_unique_prefix())
    yield store
    await store.close()


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[StateStore]:
    """Each store the proxy can be configured with, for the contract they share."""
    if request.param == "memory":
        yield MemoryStore()
        return
    redis_store = RedisStore(request.getfixturevalue("redis_url"), ttl_seconds=60, key_prefix=_unique_prefix())
    yield redis_store
    await redis_store.close()


def _unique_prefix() -> str:
    return f"test:{uuid.uuid4().hex}:"
