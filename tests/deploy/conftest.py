"""The container image, run for real with podman: the image under test and a way to run locked-down containers.

The image is built by `deploy/ci/build_image.sh` (which `.ci/run` runs on every CI run) and named to the tests by
`COMPACTION_PROXY_IMAGE`. Without it the image tests skip, and the run says so at its end with the command that
enables them; with `CI` set a missing image is a failure, never a skip.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pytest

IMAGE_ENV = "COMPACTION_PROXY_IMAGE"
ENABLE = (
    f"sudo bash deploy/ci/build_image.sh && {IMAGE_ENV}=localhost/compaction-proxy:ci python -m pytest -q tests/deploy"
)
"""The command that builds the image and runs these tests (root, podman, buildah, runc and debootstrap: see
deploy/README.md)."""

PODMAN_TIMEOUT_SECONDS = 60.0
STARTUP_DEADLINE_SECONDS = 30.0

RUNTIME = ("--runtime", "runc")
"""crun refuses the cgroup setup of machines like CI's; runc works."""

LIMITS = ("--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096")
"""Explicit limits: podman's default raises the open-file limit, which CI's machine does not permit."""

LOCKED_DOWN = ("--read-only", "--cap-drop", "all", "--security-opt", "no-new-privileges")
"""How the image must run: the Kubernetes examples' hardening."""


def podman(*args: str, check: bool = True, timeout: float = PODMAN_TIMEOUT_SECONDS) -> subprocess.CompletedProcess[str]:
    """Run a podman command and return what it did; raises with its output when it fails and `check` is set."""
    done = subprocess.run(["podman", *RUNTIME, *args], check=False, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:2])} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return done


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def image() -> str:
    """The image under test, checked to exist in podman's storage."""
    name = os.environ.get(IMAGE_ENV)
    if not name or shutil.which("podman") is None:
        reason = f"the container image tests need podman and {IMAGE_ENV}; run: {ENABLE}"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}. CI is set: the image must be built and tested in CI")
        pytest.skip(reason)
    if podman("image", "exists", name, check=False).returncode != 0:
        pytest.fail(f"{IMAGE_ENV}={name} names no image podman has; build it: {ENABLE}")
    return name


@dataclass
class Container:
    """A detached container of the image, on the host's network, listening on `port` of 127.0.0.1."""

    name: str
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def exec(self, *command: str) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name, *command, check=False)

    def wait_until_listening(self) -> None:
        """Poll until the proxy accepts connections, failing at the deadline or if the container exits first."""
        deadline = time.monotonic() + STARTUP_DEADLINE_SECONDS
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                state = podman("inspect", "--format", "{{.State.Status}}", self.name, check=False).stdout.strip()
                if state not in ("created", "running"):
                    logs = podman("logs", self.name, check=False)
                    output = (logs.stdout + logs.stderr)[-2000:]
                    raise AssertionError(f"the container stopped ({state}): {output}") from None
                time.sleep(0.1)
        raise AssertionError("the proxy in the container did not listen in time")

    def exit_code(self, within: float = PODMAN_TIMEOUT_SECONDS) -> int:
        """Wait for the container to exit and return its exit code."""
        return int(podman("wait", self.name, timeout=within).stdout.strip())


@pytest.fixture
def run_container(image: str) -> Iterator[Callable[..., Container]]:
    """Start locked-down proxy containers: `run_container(upstream_url, extra_podman_args=())`; removed at the end."""
    names: list[str] = []

    def run(upstream: str, extra: Sequence[str] = ()) -> Container:
        container = Container(f"compaction-proxy-test-{uuid.uuid4().hex[:12]}", free_port())
        podman(
            *("run", "--detach", "--name", container.name, "--network", "host", *LIMITS, *LOCKED_DOWN, *extra),
            *("--health-interval", "disable"),
            *("-e", f"COMPACTION_PROXY_PORT={container.port}", "-e", "COMPACTION_PROXY_HOST=127.0.0.1"),
            *("-e", f"COMPACTION_PROXY_UPSTREAM={upstream}", image),
        )
        names.append(container.name)
        container.wait_until_listening()
        return container

    yield run
    for name in names:
        podman("rm", "--force", "--time", "0", name, check=False)
