"""The real proxy as its own OS process on loopback, started the way an operator starts it, for tests that measure it.

Tests about stalls, memory or logs need the proxy in a process of its own: its event loop must not be the test's,
its RSS must be its own, and its logs must be what it writes to stderr. `ProcessProxy` runs

    python -c "from proxy.cli import main; main()" serve --host 127.0.0.1 --port 0 --log-format json

with every setting passed as a `COMPACTION_PROXY_*` environment variable (any `COMPACTION_PROXY_*` of the test's own
environment is dropped, so a run is hermetic) and `PYTHONPATH` set to the root of the checkout this file belongs to.
A thread reads the child's stderr from the start, so the child never blocks on a full pipe however busy the test is.

API (stable; other test modules rely on it):

- `ProcessProxy(upstream, *, nofile=None, within=30.0, command=None, **settings)`: an async context manager.
  `upstream` None leaves the upstream at its default. `command`, when given, is the whole command line to run instead
  of the one above (e.g. the `compaction-proxy serve` console script with no flags), in the same environment.
  `settings` are `Settings` field names (`max_messages=1000`, `proxy_keys=[...]`, `context_windows={...}`): scalars
  are passed as `str(value)`, booleans as `true`/`false`, lists and dicts as JSON. `nofile` sets the child's soft
  RLIMIT_NOFILE (open files and sockets) before the proxy imports anything. `within` bounds the wait for the
  "listening" line.
- `await proxy.start()` / `await proxy.stop(within=10.0)`: start and wait for the "listening" log line; stop with
  SIGTERM, then SIGKILL if the process has not exited `within` seconds later. Returns the exit status.
- `proxy.url` (`http://127.0.0.1:<port>`), `proxy.port`, `proxy.pid`, `proxy.returncode` (None while running).
- `proxy.lines`: a snapshot of every stderr line so far (without line ends); `proxy.logged_bytes`: the total bytes
  written to stderr so far; `proxy.records()`: the lines that parse as JSON objects (the proxy's structured logs).
- `proxy.rss_bytes()`: the child's resident set size now (VmRSS from `/proc/<pid>/status`), in bytes.
- `await proxy.wait_for_log(predicate, within=10.0)`: the first record (now or to come) for which `predicate` holds.

And the pytest fixture factory `start_process_proxy`: `await start_process_proxy(upstream_url, **same_keywords)`
returns a started `ProcessProxy`; every proxy started is stopped when the test ends. A conftest imports it; a test
module binds it by assignment (an import shadowed by the test's argument trips ruff's F811)::

    from tests.support import process_proxy

    start_process_proxy = process_proxy.start_process_proxy
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Self

import pytest

__all__ = ["REPOSITORY_ROOT", "ProcessProxy", "StartProcessProxy", "proxy_environment", "start_process_proxy"]

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
"""The checkout this file belongs to: the child imports `proxy` from here, whatever is installed."""

_ENV_PREFIX = "COMPACTION_PROXY_"

_CHILD_CODE = """\
import sys
if {nofile!r} is not None:
    import resource
    resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile!r}, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from proxy.cli import main
sys.exit(main())
"""
"""What the child runs: the console script's entry point, after lowering its file limit when asked to."""


def _env_value(value: Any) -> str:
    """A setting as the environment carries it (the settings loader parses JSON lists and mappings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple | dict):
        return json.dumps(value)
    return str(value)


def proxy_environment(upstream: str | None, settings: Mapping[str, Any]) -> dict[str, str]:
    """The child's environment: the test's own without any `COMPACTION_PROXY_*`, plus `settings` and `PYTHONPATH`."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith(_ENV_PREFIX)}
    environment.update({_ENV_PREFIX + name.upper(): _env_value(value) for name, value in settings.items()})
    if upstream is not None:
        environment[_ENV_PREFIX + "UPSTREAM"] = upstream
    environment["PYTHONPATH"] = str(REPOSITORY_ROOT)
    environment["PYTHONUNBUFFERED"] = "1"
    return environment


class ProcessProxy:
    """The proxy running as a child process on 127.0.0.1, its stderr collected line by line (see the module doc)."""

    def __init__(
        self,
        upstream: str | None,
        *,
        nofile: int | None = None,
        within: float = 30.0,
        command: Sequence[str] | None = None,
        **settings: Any,
    ) -> None:
        self.upstream = upstream
        self.nofile = nofile
        self.command = command
        self.within = within
        self.settings = settings
        self._popen: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._lock = threading.Lock()
        self._lines: list[str] = []
        self._bytes = 0
        self._address: str | None = None

    # ---- lifecycle -------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the child and wait until it logs that it is listening.

        :raises AssertionError: The child exited, or did not listen within `within` seconds (its stderr is quoted).
        """
        if self._popen is not None:
            raise RuntimeError("ProcessProxy is already started")
        command = self.command or [
            sys.executable,
            "-c",
            _CHILD_CODE.format(nofile=self.nofile),
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--log-format",
            "json",
        ]
        # Popen returns at once; the reader is a thread, so the child never waits on the test's event loop.
        self._popen = subprocess.Popen(  # noqa: ASYNC220
            command,
            env=proxy_environment(self.upstream, self.settings),
            cwd=REPOSITORY_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        assert self._popen.stderr is not None
        self._reader = threading.Thread(target=self._read, args=(self._popen.stderr,), daemon=True)
        self._reader.start()
        try:
            record = await self.wait_for_log(lambda line: line.get("message") == "listening", within=self.within)
        except AssertionError:
            await self.stop()
            raise AssertionError("the proxy did not start:\n" + "\n".join(self.lines[-20:])) from None
        self._address = str(record["addresses"][0])

    async def stop(self, within: float = 10.0) -> int:
        """Send SIGTERM; SIGKILL if the child is still running `within` seconds later. Returns the exit status."""
        popen = self._popen
        if popen is None:
            raise RuntimeError("ProcessProxy was never started")
        if popen.poll() is None:
            popen.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(popen.wait, within)
            except subprocess.TimeoutExpired:
                popen.kill()
                await asyncio.to_thread(popen.wait)
        if self._reader is not None:
            await asyncio.to_thread(self._reader.join)
        return popen.returncode

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _read(self, stream: IO[bytes]) -> None:
        """The reader thread: append each stderr line as it comes, until the child closes the pipe."""
        with stream:
            for raw in stream:
                with self._lock:
                    self._bytes += len(raw)
                    self._lines.append(raw.rstrip(b"\r\n").decode("utf-8", "replace"))

    # ---- where it is -----------------------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The child's process id."""
        if self._popen is None:
            raise RuntimeError("ProcessProxy is not started")
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """The child's exit status, or None while it runs."""
        return None if self._popen is None else self._popen.poll()

    @property
    def port(self) -> int:
        """The port the proxy listens on."""
        if self._address is None:
            raise RuntimeError("ProcessProxy is not listening")
        return int(self._address.rsplit(":", 1)[1])

    @property
    def url(self) -> str:
        """`http://127.0.0.1:<port>`: the proxy's base URL (an OpenAI SDK's base_url is this plus `/v1`)."""
        return f"http://127.0.0.1:{self.port}"

    # ---- what it did -----------------------------------------------------------------------------------------------

    @property
    def lines(self) -> list[str]:
        """Every stderr line so far, in order, without line ends (a copy)."""
        with self._lock:
            return list(self._lines)

    @property
    def logged_bytes(self) -> int:
        """The total bytes the child has written to stderr so far, line ends included."""
        with self._lock:
            return self._bytes

    def records(self) -> list[dict[str, Any]]:
        """The stderr lines that are JSON objects (the proxy's structured log records), in order."""
        records: list[dict[str, Any]] = []
        for line in self.lines:
            try:
                parsed = json.loads(line)
            except ValueError:
                continue
            if isinstance(parsed, dict):
                records.append(parsed)
        return records

    async def wait_for_log(self, predicate: Callable[[dict[str, Any]], bool], within: float = 10.0) -> dict[str, Any]:
        """The first log record satisfying `predicate`, waiting for it up to `within` seconds.

        :raises AssertionError: No such record in time, or the child exited without writing one.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            finished = self.returncode is not None and not (self._reader and self._reader.is_alive())
            for record in self.records():
                if predicate(record):
                    return record
            if finished:
                raise AssertionError(f"the proxy exited with status {self.returncode} before the awaited log line")
            if loop.time() > deadline:
                raise AssertionError(f"the awaited log line did not come within {within} s")
            await asyncio.sleep(0.02)

    def rss_bytes(self) -> int:
        """The child's resident set size now, in bytes (VmRSS of `/proc/<pid>/status`)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no VmRSS for process {self.pid}")


StartProcessProxy = Callable[..., Awaitable[ProcessProxy]]


@pytest.fixture
async def start_process_proxy() -> AsyncIterator[StartProcessProxy]:
    """`await start_process_proxy(upstream_url, *, nofile=None, **settings)`: a started `ProcessProxy`.

    Every proxy it started is stopped (SIGTERM, then SIGKILL) when the test ends.
    """
    started: list[ProcessProxy] = []

    async def start(upstream: str | None, *, nofile: int | None = None, **settings: Any) -> ProcessProxy:
        proxy = ProcessProxy(upstream, nofile=nofile, **settings)
        await proxy.start()
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        await proxy.stop()
