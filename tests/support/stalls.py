"""What a stall of the proxy's event loop is, judged against the same machine in the same run, never in seconds.

A stall shows as `/healthz` round trips that wait while the loop is held. On a shared machine any round trip can wait
a little (another process has the core); a stall is waiting that makes up a large share of the work that caused it.
What the machine itself makes a round trip wait meanwhile is measured too, on a `ControlServer` of its own: an idle
server in another process, probed while the work runs, waits only for the machine, never for the proxy's loop.
The findings this guards against were all of that kind: the loop held from a request's first byte to its last (27 s
of a 200,000-message request, 38.7 s of a gzip bomb's relay), or for most of the time huge bodies were in flight.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Sequence

STALL_SHARE = 0.25
"""The longest single `/healthz` wait, as a share of the work in flight meanwhile, that is not a stall."""

HELD_SHARE = 0.5
"""The share of the work's time `/healthz` may spend in waits longer than noise before the loop counts as held."""

IDLE_FACTOR = 20
"""A wait within this many times the slowest probe of the idle proxy, just before, is scheduling noise."""

CONTROL_FACTOR = 2
"""A wait within this many times the slowest probe of the `ControlServer` meanwhile is the machine's, not a stall."""


def assert_no_stall(waits: Sequence[float], work: float, idle: float, control: Sequence[float] = ()) -> None:
    """Fail when the `/healthz` round trips `waits`, probed back to back, show the loop held during `work` seconds.

    :param idle: The slowest round trip probing the same proxy with nothing in flight, measured just before.
    :param control: The round trips to a `ControlServer` probed during the same work: the machine's own waiting.
    """
    noise = max(IDLE_FACTOR * idle, CONTROL_FACTOR * max(control, default=0.0))
    slowest = max(waits)
    held = sum(wait for wait in waits if wait > noise)
    assert slowest < max(STALL_SHARE * work, noise), (
        f"/healthz waited {slowest:.3f} s at once while {work:.3f} s of work was in flight (idle: {idle:.4f} s)"
    )
    assert held < HELD_SHARE * work, (
        f"/healthz spent {held:.3f} s of the {work:.3f} s of work in flight waiting (idle: {idle:.4f} s)"
    )


_CONTROL_CODE = """\
import http.server, sys
class Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Healthy)
print(server.server_address[1], flush=True)
server.serve_forever()
"""
"""An idle HTTP server answering `GET` with 200 on a free loopback port, which it prints first."""


class ControlServer:
    """An idle server in a process of its own, probed beside the proxy: how long this machine makes a round trip wait.

    Use as a context manager; `port` is where it listens.
    """

    def __enter__(self) -> ControlServer:
        self._process = subprocess.Popen([sys.executable, "-c", _CONTROL_CODE], stdout=subprocess.PIPE, text=True)
        assert self._process.stdout is not None
        self.port = int(self._process.stdout.readline())
        return self

    def __exit__(self, *_: object) -> None:
        self._process.terminate()
        self._process.wait()


_PROBE_CODE = """\
import http.client, sys, time
host, port = sys.argv[1], int(sys.argv[2])
connection = http.client.HTTPConnection(host, port)
while True:
    sent = time.perf_counter()
    connection.request("GET", "/healthz")
    response = connection.getresponse()
    response.read()
    assert response.status == 200, response.status
    print(time.perf_counter() - sent, flush=True)
    time.sleep(0.01)
"""
"""The probe: `/healthz` back to back on one kept-alive connection, each round trip's seconds a line on stdout."""


class HealthProbe:
    """Probes `/healthz` from a process of its own, so only the proxy's loop (never the test's) can hold it up.

    A probe on the proxy's own loop would start late, after a stall, and measure nothing of it; a probe thread in the
    test's process shares its interpreter lock, and waits its turn behind any busy thread, the proxy's included.

    :param host: The proxy's address, as the probe connects to it.
    :param port: The proxy's port.
    """

    def __init__(self, host: str, port: int) -> None:
        self.waits: list[float] = []
        self._process = subprocess.Popen(
            [sys.executable, "-c", _PROBE_CODE, host, str(port)], stdout=subprocess.PIPE, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self.waits.append(float(line))

    def stop(self) -> list[float]:
        """Stop probing; return every round trip's seconds, in order."""
        self._process.terminate()
        self._process.wait()
        self._reader.join()
        return self.waits
