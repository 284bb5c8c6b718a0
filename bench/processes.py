"""Child processes of the benchmark: start a server, learn its URL, read its memory, and always stop it.

Every server binds port 0 on 127.0.0.1 and says where it listens: the bench's own servers print the URL on stdout,
the proxy logs a JSON `listening` line on stderr. `Server` is a context manager, so a process is stopped (SIGTERM,
then SIGKILL after a grace period) however the block is left.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

ROOT = Path(__file__).resolve().parent.parent
"""The repository root: children run from here, so `python -m proxy.cli` and `python -m bench.*` resolve."""

START_TIMEOUT = 30.0
"""Seconds a server may take to say where it listens."""

STOP_GRACE = 10.0
"""Seconds a server gets to exit after SIGTERM before it is killed."""

_URL = re.compile(r"http://127\.0\.0\.1:\d+")


class ServerFailed(RuntimeError):
    """A child server exited or stayed silent instead of announcing its URL."""


class Server:
    """A server child process: `with Server(name, args) as server: server.url`.

    :param name: What the process is, for error messages and the log file name.
    :param args: Arguments after `python` (e.g. `["-m", "bench.instant_upstream", "--port", "0"]`); the whole command
        when `url` is given.
    :param log_dir: Where its stdout and stderr go (one `<name>.log` file).
    :param env: Extra environment variables.
    :param url_on_stderr: The URL is in a JSON `listening` log line on stderr (the proxy), not printed on stdout.
    :param url: The URL, known in advance (a server of someone else's that announces it its own way); the server is
        ready once `url + health_path` answers 200.
    :param health_path: See `url`.
    :param start_timeout: Seconds the server may take to be ready.
    :param client_headers: Headers every request to it must carry (a key of its own).
    """

    def __init__(
        self,
        name: str,
        args: Sequence[str],
        log_dir: Path,
        *,
        env: Mapping[str, str] | None = None,
        url_on_stderr: bool = False,
        url: str = "",
        health_path: str = "/",
        start_timeout: float = START_TIMEOUT,
        client_headers: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.args = [*args] if url else [sys.executable, *args]
        self.log_path = log_dir / f"{name}.log"
        self.env = {**os.environ, **(env or {})}
        self.url_on_stderr = url_on_stderr
        self.process: subprocess.Popen[bytes] | None = None
        self.url = url
        self.health_path = health_path
        self.start_timeout = start_timeout
        self.client_headers = dict(client_headers or {})
        self._log: IO[bytes] | None = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        """The child's process id."""
        assert self.process is not None, "not started"
        return self.process.pid

    def start(self) -> None:
        """Start the child and wait until it says where it listens (stopping it if it does not)."""
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            self.args, cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT
        )
        try:
            self.url = self._wait_for_health() if self.url else self._wait_for_url()
        except BaseException:
            self.stop()
            raise

    def _wait_for_health(self) -> str:
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + self.health_path, timeout=2) as answer:
                    if answer.status == 200:
                        return self.url
            except OSError:
                pass
            if self.process.poll() is not None:
                text = self.log_path.read_text(errors="replace")
                raise ServerFailed(f"{self.name} exited with {self.process.returncode}: {text[-2000:]}")
            time.sleep(0.2)
        raise ServerFailed(f"{self.name} was not ready within {self.start_timeout:.0f} s")

    def _wait_for_url(self) -> str:
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            for line in text.splitlines():
                url = self._url_in(line)
                if url:
                    return url
            if self.process.poll() is not None:
                raise ServerFailed(f"{self.name} exited with {self.process.returncode}: {text[-2000:]}")
            time.sleep(0.05)
        raise ServerFailed(f"{self.name} did not announce a URL within {self.start_timeout:.0f} s")

    def _url_in(self, line: str) -> str | None:
        if not self.url_on_stderr:
            match = _URL.fullmatch(line.strip())
            return match.group(0) if match else None
        if '"listening"' not in line:
            return None
        try:
            addresses = json.loads(line).get("addresses") or []
        except json.JSONDecodeError:
            return None
        return f"http://{addresses[0]}" if addresses else None

    def stop(self) -> None:
        """Stop the child: SIGTERM, then SIGKILL after `STOP_GRACE` seconds. Safe to call twice."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def rss_kib(self) -> int:
        """The child's resident set size (VmRSS), in KiB."""
        return rss_kib(self.pid)


def rss_kib(pid: int) -> int:
    """VmRSS of a process from /proc/PID/status, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far, in seconds (from /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks
