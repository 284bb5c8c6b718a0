"""`state_ca_bundle`: a `rediss://` Redis whose certificate a private CA signed, trusted on top of the default trust.

Real redis-servers with TLS only, on loopback, with certificates from CAs the test makes (tests/support/private_ca.py).
As in tests/server/test_private_ca.py, a second CA given to OpenSSL as `SSL_CERT_FILE` stands for the default trust.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from proxy.config import Settings
from proxy.state.open import open_store
from tests.state.conftest import STARTUP_DEADLINE_SECONDS, _free_port
from tests.support.private_ca import PrivateCA, ServerCertificate

TENANT, CHAIN = b"tenant", b"chain"


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[Callable[[PrivateCA, ServerCertificate], str]]:
    """Start redis-servers that speak TLS only: `url = tls_redis(ca, certificate)`, a `rediss://` URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run installs it)")
    processes: list[subprocess.Popen[bytes]] = []

    def start(ca: PrivateCA, certificate: ServerCertificate) -> str:
        port = _free_port()
        process = subprocess.Popen(
            [
                *(binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", ""),
                *("--tls-cert-file", str(certificate.certificate), "--tls-key-file", str(certificate.key)),
                *("--tls-ca-cert-file", str(ca.bundle), "--tls-auth-clients", "no", "--dir", str(tmp_path)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        processes.append(process)
        url = f"rediss://127.0.0.1:{port}/0"
        deadline = time.monotonic() + STARTUP_DEADLINE_SECONDS
        while True:
            assert process.poll() is None, "redis-server with TLS exited (built without TLS support?)"
            try:
                with redis.Redis.from_url(url, ssl_ca_certs=str(ca.bundle), socket_connect_timeout=0.2) as client:
                    client.ping()
                return url
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server with TLS did not answer in time"
                time.sleep(0.02)

    yield start
    for process in processes:
        process.terminate()
        process.wait(timeout=5)


async def _round_trip(settings: Settings) -> tuple[int, int] | None:
    store = open_store(settings)
    try:
        await store.save_anchor(TENANT, CHAIN, 1234)
        return await store.latest_anchor(TENANT, [CHAIN])
    finally:
        await store.close()


async def test_rediss_behind_a_private_ca_works_only_with_state_ca_bundle(
    tmp_path: Path, tls_redis: Callable[[PrivateCA, ServerCertificate], str]
) -> None:
    ca = PrivateCA.create(tmp_path, "private")
    url = tls_redis(ca, ca.issue("redis"))

    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        await _round_trip(Settings(state_url=url))
    assert await _round_trip(Settings(state_url=url, state_ca_bundle=ca.bundle)) == (0, 1234)


async def test_state_ca_bundle_keeps_the_default_trust(
    tmp_path: Path, tls_redis: Callable[[PrivateCA, ServerCertificate], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    private, public = PrivateCA.create(tmp_path, "private"), PrivateCA.create(tmp_path, "public")
    monkeypatch.setenv("SSL_CERT_FILE", str(public.bundle))
    url = tls_redis(public, public.issue("redis"))

    assert await _round_trip(Settings(state_url=url, state_ca_bundle=private.bundle)) == (0, 1234)


def test_state_ca_bundle_needs_a_rediss_url(tmp_path: Path) -> None:
    ca = PrivateCA.create(tmp_path, "private")
    with pytest.raises(ValueError, match="state_ca_bundle applies only to a rediss:// state_url"):
        Settings(state_url="redis://127.0.0.1:6379/0", state_ca_bundle=ca.bundle)
