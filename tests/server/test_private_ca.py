"""`upstream_ca_bundle`: an upstream whose certificate a private CA signed, trusted on top of the default trust.

The upstream is a loopback HTTPS server with a certificate from a CA the test makes. A second CA, given to OpenSSL as
`SSL_CERT_FILE` (which is where the default trust comes from), stands for the public CAs: with the setting, both
upstreams are served, so the bundle is added to the default trust and does not replace it.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.config import Settings
from proxy.pipeline.service import CompactionPipeline
from tests.server.helpers import MakeProxy
from tests.support.private_ca import PrivateCA, ServerCertificate

COMPLETION = {
    "id": "chatcmpl-tls",
    "object": "chat.completion",
    "created": 1_715_367_049,
    "model": "gpt-4o-mini",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "over TLS"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
}
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]}
AUTHORIZATION = "Bearer sk-client-key"
SERVED_WINDOW = 4096


class HttpsUpstreams:
    """Loopback HTTPS upstreams answering one chat completion, each recording the Authorization header it got."""

    def __init__(self) -> None:
        self.authorizations: dict[str, list[str]] = {}
        self._runners: list[web.AppRunner] = []

    async def start(self, certificate: ServerCertificate) -> str:
        """Serve with `certificate`; returns the upstream's base URL."""
        authorizations: list[str] = []

        async def complete(request: web.Request) -> web.Response:
            await request.read()
            authorizations.append(request.headers.get("Authorization", ""))
            return web.json_response(COMPLETION)

        async def props(request: web.Request) -> web.Response:
            return web.json_response({"default_generation_settings": {"n_ctx": SERVED_WINDOW}})

        app = web.Application()
        app.router.add_post("/v1/chat/completions", complete)
        app.router.add_get("/props", props)  # llama.cpp's server, which says what window it serves
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self._runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=certificate.server_context()).start()
        url = f"https://127.0.0.1:{runner.addresses[0][1]}"
        self.authorizations[url] = authorizations
        return url

    async def close(self) -> None:
        for runner in self._runners:
            await runner.cleanup()


@pytest.fixture
def private_ca(tmp_path: Path) -> PrivateCA:
    return PrivateCA.create(tmp_path, "private")


@pytest.fixture
def public_ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PrivateCA:
    """A CA in the default trust: OpenSSL's default verify paths read `SSL_CERT_FILE` each time a context loads them."""
    ca = PrivateCA.create(tmp_path, "public")
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.bundle))
    return ca


@pytest.fixture
async def https_upstreams() -> AsyncIterator[HttpsUpstreams]:
    upstreams = HttpsUpstreams()
    yield upstreams
    await upstreams.close()


async def _chat(http: aiohttp.ClientSession, proxy_url: str) -> tuple[int, dict[str, Any]]:
    async with http.post(f"{proxy_url}/v1/chat/completions", json=CHAT, headers={"Authorization": AUTHORIZATION}) as r:
        return r.status, await r.json()


async def test_upstream_behind_a_private_ca_is_served_only_with_upstream_ca_bundle(
    private_ca: PrivateCA, https_upstreams: HttpsUpstreams, make_proxy: MakeProxy, http: aiohttp.ClientSession
) -> None:
    upstream = await https_upstreams.start(private_ca.issue("upstream"))

    status, body = await _chat(http, (await make_proxy(upstream)).url)
    assert status == 502
    assert body["error"] == {
        "message": "The upstream could not be reached: TLS handshake failed.",
        "type": "upstream_error",
        "param": None,
        "code": "upstream_unreachable",
    }
    assert https_upstreams.authorizations[upstream] == []

    status, body = await _chat(http, (await make_proxy(upstream, upstream_ca_bundle=private_ca.bundle)).url)
    assert status == 200, body
    assert body["choices"][0]["message"]["content"] == "over TLS"
    assert https_upstreams.authorizations[upstream] == [AUTHORIZATION]


async def test_window_probes_trust_the_upstream_ca_bundle_too(
    private_ca: PrivateCA, https_upstreams: HttpsUpstreams, make_proxy: MakeProxy, http: aiohttp.ClientSession
) -> None:
    upstream = await https_upstreams.start(private_ca.issue("upstream"))
    settings = {"upstream_ca_bundle": private_ca.bundle, "window_probes": ["llama_cpp_props"]}
    service = CompactionPipeline(Settings(upstream=upstream, **settings))
    proxy = await make_proxy(upstream, service, **settings)
    local = {**CHAT, "model": "local-model"}  # no table knows it: the first request waits for the probe
    async with http.post(f"{proxy.url}/v1/chat/completions", json=local, headers={"Authorization": AUTHORIZATION}) as r:
        assert r.status == 200
        assert r.headers["X-Compaction-Window-Source"] == "discovered"
        assert r.headers["X-Compaction-Context-Window"] == str(SERVED_WINDOW)


async def test_upstream_ca_bundle_keeps_the_default_trust(
    private_ca: PrivateCA,
    public_ca: PrivateCA,
    https_upstreams: HttpsUpstreams,
    make_proxy: MakeProxy,
    http: aiohttp.ClientSession,
) -> None:
    upstream = await https_upstreams.start(public_ca.issue("public-upstream"))

    status, body = await _chat(http, (await make_proxy(upstream, upstream_ca_bundle=private_ca.bundle)).url)

    assert status == 200, body
    assert https_upstreams.authorizations[upstream] == [AUTHORIZATION]


def test_upstream_ssl_context_keeps_the_default_ca_certificates(private_ca: PrivateCA) -> None:
    """With the real system trust (no SSL_CERT_FILE stand-in), the context holds the defaults plus the one added CA."""
    default = ssl.create_default_context().cert_store_stats()["x509_ca"]
    context = Settings(upstream_ca_bundle=private_ca.bundle).upstream_ssl()

    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.cert_store_stats()["x509_ca"] == default + 1


@pytest.mark.parametrize("content", ["", "not a certificate\n"])
def test_upstream_ca_bundle_without_a_certificate_is_a_settings_error(tmp_path: Path, content: str) -> None:
    bundle = tmp_path / "bundle.pem"
    bundle.write_text(content)
    with pytest.raises(ValueError, match="must be a readable PEM file of CA certificates"):
        Settings(upstream_ca_bundle=bundle)


def test_upstream_ca_bundle_that_does_not_exist_is_a_settings_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Path does not point to a file"):
        Settings(upstream_ca_bundle=tmp_path / "missing.pem")
