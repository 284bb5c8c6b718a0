"""Several proxy processes on one port (`workers` > 1): one per core, each a whole proxy.

The parent binds the port first (so `port` 0 resolves to one port for all of them) with `SO_REUSEPORT`, then forks
the workers; each listens on that port with `SO_REUSEPORT` too, and the kernel spreads new connections over them.
The parent only supervises: SIGTERM or SIGINT is passed on to every worker, each shuts down gracefully as a single
proxy does (`shutdown_grace_seconds`), and the parent returns once all have exited. A worker that exits on its own
(it could not listen, it crashed) stops the others too: the process as a whole then fails, and whatever runs it
(Kubernetes, systemd) restarts it whole, rather than serving on fewer cores without anyone knowing.

Workers share nothing in memory: conversation state must live in Redis (`Settings` refuses `workers` > 1 with
`memory://`), and metrics go through files in one directory, so `/metrics` reports the whole pod whichever worker
answers the scrape (`proxy.server.pod_metrics`).
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
from types import FrameType

from proxy.config import Settings
from proxy.pipeline.exchange import Compaction
from proxy.server.logging import SERVER_LOGGER, configure_logging
from proxy.server.main import serve
from proxy.server.pod_metrics import PodMetrics

log = logging.getLogger(SERVER_LOGGER)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` with `SO_REUSEPORT`, not listening: it fixes the port the workers share.

    :raises OSError: The address could not be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    reserved = socket.socket(family, socket.SOCK_STREAM)
    try:
        reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        reserved.bind((host, port))
    except OSError:
        reserved.close()
        raise
    return reserved


def serve_workers(settings: Settings, compaction: Compaction) -> int:
    """Run `settings.workers` proxies on one port until SIGTERM/SIGINT; return the exit status.

    0 when every worker stopped cleanly after the signal; 1 when one could not start or exited on its own.

    :param compaction: The compaction side, built and not yet started: each worker starts its own copy of it (a fork).
    :raises OSError: The address could not be bound.
    """
    configure_logging(settings)
    reserved = reserve_port(settings.host, settings.port)
    shared = settings.model_copy(update={"port": reserved.getsockname()[1]})
    pod_metrics = PodMetrics()
    context = multiprocessing.get_context("fork")
    workers = [
        context.Process(target=_worker, args=(shared, compaction, index, reserved), name=f"worker-{index}")
        for index in range(settings.workers)
    ]
    stopping = False
    signalled: set[int] = set()

    def stop(signum: int, frame: FrameType | None) -> None:
        """Ask every running worker to stop, once: a second signal would cut a draining worker short."""
        nonlocal stopping
        stopping = True
        for worker in workers:
            if worker.pid is not None and worker.pid not in signalled and worker.exitcode is None:
                signalled.add(worker.pid)
                os.kill(worker.pid, signal.SIGTERM)

    previous = {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}
    try:
        for worker in workers:
            if not stopping:
                worker.start()
        log.info("workers started", extra={"fields": {"workers": [worker.pid for worker in workers]}})
        ended = multiprocessing.connection.wait([worker.sentinel for worker in workers if worker.pid is not None])
        if not stopping:
            failed = next(worker for worker in workers if worker.sentinel in ended)
            failed.join()
            log.error(
                "a worker exited on its own; stopping the others",
                extra={"fields": {"worker": failed.name, "exit_status": failed.exitcode}},
            )
            stop(signal.SIGTERM, None)
            stopping = False
        for worker in workers:
            if worker.pid is not None:
                worker.join()
                pod_metrics.worker_exited(worker.pid)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        reserved.close()
        pod_metrics.close()
    log.info("stopped")
    return 0 if stopping and all(worker.exitcode == 0 for worker in workers) else 1


def _worker(settings: Settings, compaction: Compaction, index: int, reserved: socket.socket) -> None:
    """One worker (in the forked child): a whole proxy on the shared port; exits 1 when it cannot listen."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)  # until the worker's event loop takes them over
    reserved.close()
    try:
        serve(settings, compaction, worker=index)
    except OSError as exc:
        log.error("a worker cannot listen", extra={"fields": {"worker": index, "error": exc.strerror or str(exc)}})
        raise SystemExit(1) from None
