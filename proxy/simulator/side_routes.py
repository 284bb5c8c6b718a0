"""The OpenAI upstream's routes beside the model: `/v1/models`, `/v1/embeddings` and an `/echo/...` endpoint.

Embeddings are deterministic unit vectors (equal inputs embed equally); the echo endpoint describes the request it
received, or sends a large deterministic body, so a test can check what the proxy relays byte for byte.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import struct
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from proxy.simulator.openai_common import OpenAIError, json_response, missing_parameter, parse_json_body
from proxy.simulator.openai_tokens import count_text
from proxy.simulator.responses_socket import echo_socket, is_upgrade

__all__ = ["deterministic_bytes", "echo", "embedding_vector", "embeddings", "model_json", "models_response"]

MODEL_CREATED = 1_715_367_049


def deterministic_bytes(size: int, seed: str = "echo") -> bytes:
    """Return `size` pseudo-random bytes that depend only on `size` and `seed` (the echo endpoint's large bodies)."""
    return hashlib.shake_256(f"{seed}:{size}".encode()).digest(size) if size else b""


def embedding_vector(text: str, model: str, dimensions: int) -> list[float]:
    """A deterministic unit vector for `text`: equal inputs embed equally, different ones (almost surely) not."""
    raw = hashlib.shake_256(f"{model}\x1f{text}".encode()).digest(4 * dimensions)
    values = [v / 2**31 - 1.0 for v in struct.unpack(f"<{dimensions}I", raw)]
    norm = sum(v * v for v in values) ** 0.5 or 1.0
    return [v / norm for v in values]


def _embedding_inputs(value: object) -> list[str]:
    """Normalize an embeddings `input`: a string, strings, a token array or token arrays, to one key per item."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return [json.dumps(value)]
    if isinstance(value, list) and value and all(isinstance(v, str | list) for v in value):
        return [v if isinstance(v, str) else json.dumps(v) for v in value]
    raise OpenAIError("'$.input' is invalid. Please check the API reference.", param="input")


def _describe(request: web.Request, body: bytes) -> dict[str, Any]:
    return {
        "method": request.method,
        "path": request.path,
        "raw_path": request.rel_url.raw_path,
        "query_string": request.query_string,
        "headers": [[name, value] for name, value in request.headers.items()],
        "body_sha256": hashlib.sha256(body).hexdigest(),
        "body_length": len(body),
    }


def model_json(model: str, window: int | None = None) -> dict[str, Any]:
    """A model as `/v1/models` lists it; with its `window` as vLLM lists it (`max_model_len`) when given."""
    listed: dict[str, Any] = {"id": model, "object": "model", "created": MODEL_CREATED, "owned_by": "system"}
    return listed if window is None else {**listed, "max_model_len": window}


def _encode_vector(vector: list[float], as_base64: bool) -> list[float] | str:
    if not as_base64:
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def models_response(
    models: Sequence[str], model: str | None = None, window_for: Callable[[str], int] | None = None
) -> web.Response:
    """`GET /v1/models` (every model in `models`) or, with `model`, `GET /v1/models/{model}` (404 if unknown).

    :param window_for: When given, each model is listed with its window, so a proxy can discover it.
    """

    def listed(name: str) -> dict[str, Any]:
        return model_json(name, window_for(name) if window_for is not None else None)

    if model is None:
        return json_response({"object": "list", "data": [listed(m) for m in models]})
    if model not in models:
        raise OpenAIError(f"The model '{model}' does not exist", status=404, param="model", code="model_not_found")
    return json_response(listed(model))


async def embeddings(request: web.Request) -> web.Response:
    """`POST /v1/embeddings`: a deterministic unit vector per input, usage counted with cl100k_base."""
    body = parse_json_body(await request.read())
    model = str(body.get("model") or request.match_info.get("deployment") or "")
    if not model:
        raise OpenAIError("you must provide a model parameter")
    if "input" not in body:
        raise missing_parameter("input")
    texts = _embedding_inputs(body["input"])
    dimensions = int(body.get("dimensions") or (3072 if "large" in model else 1536))
    as_base64 = body.get("encoding_format") == "base64"
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": _encode_vector(embedding_vector(t, model, dimensions), as_base64),
        }
        for i, t in enumerate(texts)
    ]
    tokens = sum(count_text(t, "cl100k_base") for t in texts)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return json_response({"object": "list", "data": data, "model": model, "usage": usage})


async def echo(request: web.Request, on_socket_closed: Callable[[int | None], None]) -> web.StreamResponse:
    """Describe the request received, or send a large deterministic body; optionally gzip it or chunk it.

    A WebSocket upgrade is answered by an echo socket instead (`proxy.simulator.responses_socket.echo_socket`).

    Query knobs: `size=N` answers N bytes of `deterministic_bytes(N)` instead of the JSON description;
    `gzip=1` gzips the body and sets `Content-Encoding: gzip`; `chunked=1` streams it in 64 KiB writes
    without Content-Length; `status=N` picks the status. `X-Body-Sha256` is the sha256 of the bytes sent.
    """
    if is_upgrade(request):
        return await echo_socket(request, on_socket_closed)
    body = await request.read()
    query = request.query
    if "size" in query:
        payload, content_type = deterministic_bytes(int(query["size"])), "application/octet-stream"
    else:
        payload, content_type = json.dumps(_describe(request, body)).encode(), "application/json"
    headers: dict[str, str] = {}
    if query.get("gzip") == "1":
        payload = gzip.compress(payload, mtime=0)
        headers["Content-Encoding"] = "gzip"
    headers["X-Body-Sha256"] = hashlib.sha256(payload).hexdigest()
    status = int(query.get("status", "200"))
    if query.get("chunked") != "1":
        return web.Response(body=payload, status=status, headers=headers, content_type=content_type)
    response = web.StreamResponse(status=status, headers={**headers, "Content-Type": content_type})
    response.enable_chunked_encoding()
    await response.prepare(request)
    for start in range(0, len(payload), 65_536):
        await response.write(payload[start : start + 65_536])
    await response.write_eof()
    return response
