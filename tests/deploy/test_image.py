"""The image built from deploy/Dockerfile, run as production runs it: read-only root, uid 10001, no capabilities,
`no-new-privileges`, and a real client and upstream on loopback (the container shares the host's network).

See conftest.py for how the image is named and why these tests never skip in CI.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import openai

from proxy.engine.encodings import get_encoding
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.deploy.conftest import LIMITS, Container, podman

CLIENT_KEY = "sk-image-test-client-key"
SAMPLE = "Compaction keeps long agent runs inside the window: ünïcödé, code `x = f(y)`, 12345."


def _proc_status(container: Container) -> dict[str, str]:
    """The proxy process's (PID 1) /proc status fields, read inside the container."""
    done = container.exec("cat", "/proc/1/status")
    assert done.returncode == 0, done.stderr
    return dict(line.split(":\t", 1) for line in done.stdout.splitlines() if ":\t" in line)


async def test_locked_down_container_is_healthy_and_ready(run_container: Callable[..., Container]) -> None:
    async with OpenAIUpstream() as upstream:
        container = run_container(upstream.base_url)

        status = _proc_status(container)
        assert status["Uid"].split()[:2] == ["10001", "10001"], status["Uid"]
        assert status["Gid"].split()[:2] == ["10001", "10001"], status["Gid"]
        assert int(status["CapEff"], 16) == 0 and int(status["CapBnd"], 16) == 0
        assert status["NoNewPrivs"].strip() == "1"
        write = container.exec("python", "-c", "open('/opt/venv/written', 'w')")
        assert write.returncode != 0 and "Read-only file system" in write.stderr

        async with aiohttp.ClientSession() as http:
            for path in ("/healthz", "/readyz"):
                async with http.get(container.url + path) as response:
                    assert response.status == 200, path
        # The image's own HEALTHCHECK command, run as the container runtime runs it.
        healthcheck = podman("healthcheck", "run", container.name, check=False)
        assert healthcheck.returncode == 0, healthcheck.stdout + healthcheck.stderr


def test_both_encodings_load_with_no_network(image: str) -> None:
    count = (
        "import sys; from proxy.engine.encodings import get_encoding as g;"
        " print(*(len(g(name).encode(sys.argv[1])) for name in ('o200k_base', 'cl100k_base')))"
    )
    done = podman(
        *("run", "--rm", "--network", "none", *LIMITS, "--read-only", "--cap-drop", "all"),
        *("--entrypoint", "python", image, "-c", count, SAMPLE),
    )
    expected = [len(get_encoding(name).encode(SAMPLE)) for name in ("o200k_base", "cl100k_base")]
    assert [int(n) for n in done.stdout.split()] == expected


async def test_chat_completion_reaches_the_upstream_with_the_clients_authorization(
    run_container: Callable[..., Container],
) -> None:
    async with OpenAIUpstream() as upstream:
        container = run_container(upstream.base_url)
        client = openai.AsyncOpenAI(base_url=container.url + "/v1", api_key=CLIENT_KEY, max_retries=0)
        async with client:
            completion = await client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "hello from the image test"}]
            )
        assert completion.choices[0].message.content
        # Besides the completion, the proxy asks a self-hosted-looking upstream for the model's window (discovery):
        # those probes carry no credential, since this upstream does not ask for one. Exact counts of the request
        # (`/tokenize`, `/apply-template`) go to the same upstream as the request, with the same credential.
        [request] = [request for request in upstream.requests if request.path == "/v1/chat/completions"]
        assert request.headers["Authorization"] == f"Bearer {CLIENT_KEY}"
        counts = [request for request in upstream.requests if request.path in ("/tokenize", "/apply-template")]
        assert all(count.headers["Authorization"] == f"Bearer {CLIENT_KEY}" for count in counts)
        probes = [
            request for request in upstream.requests if request not in counts and request.path != "/v1/chat/completions"
        ]
        assert all("Authorization" not in probe.headers for probe in probes)


async def test_sigterm_lets_the_request_in_flight_finish_and_exits_0(
    run_container: Callable[..., Container],
) -> None:
    async with OpenAIUpstream(delay_first_byte=2.0) as upstream:
        container = run_container(upstream.base_url)
        async with aiohttp.ClientSession() as http:
            chat = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "answer slowly"}]}
            in_flight = asyncio.create_task(
                http.post(container.url + "/v1/chat/completions", json=chat, headers={"Authorization": "Bearer k"})
            )
            deadline = asyncio.get_running_loop().time() + 10
            while not upstream.requests:  # the request is at the upstream, waiting for its answer
                assert asyncio.get_running_loop().time() < deadline, "the request never reached the upstream"
                await asyncio.sleep(0.01)
            await asyncio.to_thread(podman, "kill", "--signal", "TERM", container.name)

            response = await in_flight
            assert response.status == 200
            assert (await response.json())["object"] == "chat.completion"
        assert await asyncio.to_thread(container.exit_code) == 0
