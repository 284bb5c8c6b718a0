"""The dashboard's paths: off by default (404, nothing forwarded), behind the proxy keys, self-contained, no content."""

from __future__ import annotations

import base64
import re
from importlib import resources

import aiohttp
import orjson

from proxy.config import Settings
from proxy.pipeline.service import CompactionPipeline
from proxy.server.dashboard import ASSETS, DATA_PATH
from proxy.server.routes import DASHBOARD_PATHS
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.server.helpers import MakeProxy
from tests.support.exported_metrics import declared_names

KEY = "dashboard-key-0123456789"
MODEL = "gpt-4o-mini"


def basic(password: str, user: str = "anyone") -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def get(url: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as response:
        return response.status, dict(response.headers), await response.read()


def test_every_dashboard_path_is_served() -> None:
    assert {*ASSETS, DATA_PATH} == DASHBOARD_PATHS


async def test_off_by_default_every_path_is_a_404_that_says_how_to_turn_it_on(
    upstream: OpenAIUpstream, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(upstream.base_url)
    assert Settings(upstream=upstream.base_url).dashboard is False
    for path in sorted(DASHBOARD_PATHS):
        status, _, body = await get(proxy.url + path)
        assert status == 404, path
        error = orjson.loads(body)["error"]
        assert error["code"] == "dashboard_off"
        assert "--dashboard true" in error["message"] and "COMPACTION_PROXY_DASHBOARD=true" in error["message"]
    assert upstream.requests == []  # answered here, never forwarded


async def test_behind_the_proxy_keys_the_page_and_the_data_need_a_key(
    upstream: OpenAIUpstream, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(upstream.base_url, dashboard=True, proxy_keys=[KEY])
    for path in sorted(DASHBOARD_PATHS):
        status, headers, body = await get(proxy.url + path)
        assert status == 401, path
        assert headers["WWW-Authenticate"] == 'Basic realm="compaction-proxy"'  # a browser asks for the key
        assert KEY not in body.decode()
        assert (await get(proxy.url + path, **{"Authorization": basic("not-the-key-0123456789")}))[0] == 401
        assert (await get(proxy.url + path, **{"X-Proxy-Key": KEY}))[0] == 200
        assert (await get(proxy.url + path, **{"Proxy-Authorization": f"Bearer {KEY}"}))[0] == 200
        assert (await get(proxy.url + path, **{"Authorization": basic(KEY)}))[0] == 200
    # A browser's Basic credentials open the dashboard only: a forwarded request still needs the proxy's own header.
    assert (await get(proxy.url + "/v1/models", **{"Authorization": basic(KEY)}))[0] == 401
    assert (await get(proxy.url + "/metrics"))[0] == 200  # scrapers need no key, as before


async def test_the_page_loads_nothing_from_elsewhere_and_says_so_in_its_policy(
    upstream: OpenAIUpstream, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(upstream.base_url, dashboard=True)
    for path, (name, content_type) in ASSETS.items():
        status, headers, body = await get(proxy.url + path)
        assert status == 200
        assert headers["Content-Type"].startswith(content_type)
        assert body == resources.files("proxy.server").joinpath("static", name).read_bytes()
        assert "default-src 'none'" in headers["Content-Security-Policy"]
        assert not re.search(rb"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", body.replace(b"http://www.w3.org/2000/svg", b""))


async def test_the_data_never_holds_message_content_and_names_only_metrics_the_proxy_serves(
    upstream: OpenAIUpstream, make_proxy: MakeProxy
) -> None:
    settings = {"context_windows": {MODEL: 4096}, "window_probes": [], "count_probes": []}
    service = CompactionPipeline(Settings(upstream=upstream.base_url, **settings))
    proxy = await make_proxy(upstream.base_url, service, dashboard=True, **settings)
    secret = "the-launch-code-is-4471"
    body = {"model": MODEL, "messages": [{"role": "user", "content": secret}]}
    headers = {"X-Conversation-Id": f"conversation-{secret}", "Authorization": f"Bearer sk-{secret}"}
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.post(proxy.url + "/v1/chat/completions", json=body, headers=headers) as response:
                assert response.status == 200
    status, _, data = await get(proxy.url + DATA_PATH)
    assert status == 200 and secret.encode() not in data
    served = declared_names((await get(proxy.url + "/metrics"))[2].decode())
    for figure in orjson.loads(data)["figures"]:
        assert figure["divides_by"], figure["id"]
        assert set(figure["metrics"]) <= served, figure["id"]
    requests = next(figure for figure in orjson.loads(data)["figures"] if figure["id"] == "requests")
    assert requests["items"] == [{"id": "chat_completions", "label": "chat_completions", "value": 3.0, "kind": "count"}]


async def test_the_browsers_icon_requests_are_answered_here_never_forwarded(
    upstream: OpenAIUpstream, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(upstream.base_url, dashboard=True)
    _, _, page = await get(proxy.url + "/dashboard")
    icon = re.search(rb'<link rel="icon" href="([^"]+)"', page)
    assert icon is not None
    for path in ("/" + icon.group(1).decode(), "/favicon.ico"):  # the page's own icon, and what a browser asks anyway
        status, headers, body = await get(proxy.url + path)
        assert status == 200 and headers["Content-Type"].startswith("image/svg+xml") and body.startswith(b"<svg")
    assert upstream.requests == []
