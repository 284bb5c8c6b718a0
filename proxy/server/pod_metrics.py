"""Metrics whole for the pod when several workers share one port (`workers` > 1).

A scrape reaches one worker, chosen by the kernel; had it reported only its own counters, consecutive scrapes would
alternate between workers' figures and every rate would be noise. So the workers use prometheus_client's
multiprocess mode: each writes its values to memory-mapped files of its own in one directory, and `/metrics`, in
whichever worker answers, sums every worker's files (`MultiProcessCollector`). Counters and histograms add up;
gauges are summed over the workers alive (`livesum`), and a worker's gauges are dropped once it has exited
(`mark_process_dead`).

The directory is `PROMETHEUS_MULTIPROC_DIR` when the operator sets it (emptied of earlier runs' files at start),
otherwise a fresh temporary directory removed when the proxy stops. A single process (`workers` 1) keeps its
metrics in memory, as before.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Final

from prometheus_client import CollectorRegistry, generate_latest, multiprocess, values

MULTIPROCESS_DIRECTORY: Final = "PROMETHEUS_MULTIPROC_DIR"
"""The environment variable prometheus_client reads for the directory of the workers' metric files."""


class PodMetrics:
    """The directory the workers share their metrics through; set up in the parent before the workers fork."""

    def __init__(self) -> None:
        """Make (or empty) the directory and switch prometheus_client to it for every metric created from now on.

        prometheus_client picks the multiprocess value class when it is imported, if the variable is set then; the
        proxy decides later (on `workers`), so it sets the class itself, before any worker creates a metric.
        """
        given = os.environ.get(MULTIPROCESS_DIRECTORY)
        self.owned = not given
        """Whether the directory was made here (and is removed by `close`)."""
        self.directory = given or tempfile.mkdtemp(prefix="compaction-proxy-metrics-")
        if given:
            Path(given).mkdir(parents=True, exist_ok=True)
            for stale in Path(given).glob("*.db"):
                stale.unlink()
        os.environ[MULTIPROCESS_DIRECTORY] = self.directory
        values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]

    def worker_exited(self, pid: int) -> None:
        """Drop the gauges of a worker that has exited; its counters stay in the pod's totals."""
        multiprocess.mark_process_dead(pid, self.directory)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        """Remove the directory when it was made here."""
        if self.owned:
            shutil.rmtree(self.directory, ignore_errors=True)


def shared_directory(workers: int) -> str | None:
    """The directory this worker's `/metrics` sums over, or None when the process serves alone."""
    return os.environ.get(MULTIPROCESS_DIRECTORY) if workers > 1 else None


def render_pod(directory: str) -> bytes:
    """Every worker's metrics, summed, in the Prometheus text format."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    return generate_latest(registry)
