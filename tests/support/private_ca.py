"""Certificate authorities made by the tests themselves, with the `openssl` command line, for TLS on loopback.

A `PrivateCA` is a self-signed CA (EC P-256, valid two days) in a directory of its own; `issue` signs a server
certificate for 127.0.0.1 with it. Nothing here is trusted by the system: a client trusts a CA only if told to.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
_SERVER_EXTENSIONS = """\
subjectAltName = IP:127.0.0.1
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


@dataclass(frozen=True)
class ServerCertificate:
    """A server certificate for 127.0.0.1 and its key, as PEM files."""

    certificate: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        """A TLS server context presenting this certificate."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.certificate, self.key)
        return context


@dataclass(frozen=True)
class PrivateCA:
    """A CA made for one test: its certificate (`bundle`, the PEM file a client is told to trust) and key."""

    directory: Path
    name: str

    @property
    def bundle(self) -> Path:
        return self.directory / f"{self.name}.pem"

    @property
    def key(self) -> Path:
        return self.directory / f"{self.name}.key"

    @classmethod
    def create(cls, directory: Path, name: str) -> PrivateCA:
        """Make a self-signed CA named `name` under `directory`."""
        if shutil.which("openssl") is None:
            pytest.fail("the openssl command is needed to make test certificates (apt-get install openssl)")
        ca = cls(directory, name)
        _openssl(
            *("req", "-x509", *_KEY, "-days", "2", "-subj", f"/CN={name} test CA"),
            *("-keyout", str(ca.key), "-out", str(ca.bundle)),
            *("-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"),
        )
        return ca

    def issue(self, name: str) -> ServerCertificate:
        """A server certificate for 127.0.0.1 signed by this CA."""
        key = self.directory / f"{name}.key"
        request = self.directory / f"{name}.csr"
        certificate = self.directory / f"{name}.pem"
        extensions = self.directory / f"{name}.ext"
        extensions.write_text(_SERVER_EXTENSIONS)
        _openssl("req", "-new", *_KEY, "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(request))
        _openssl(
            *("x509", "-req", "-in", str(request), "-CA", str(self.bundle), "-CAkey", str(self.key)),
            *("-set_serial", "1", "-days", "2", "-extfile", str(extensions), "-out", str(certificate)),
        )
        return ServerCertificate(certificate, key)
