"""How each kind of server states the context window of a model it serves, read from its own endpoints.

A probe asks one kind of server through `fetch` and returns the window it states for the model, or None. Only the
documented fields are read, and a value that is not a plausible window is ignored: a server answering nonsense
changes nothing.

- `openai_models`: `GET /v1/models`, the entry whose `id` is the model. vLLM and SGLang give `max_model_len`,
  llama.cpp's server `meta.n_ctx` (its `meta.n_ctx_train` is the length the model was trained for, not the one the
  server runs with, and is never used).
- `llama_cpp_props`: `GET /props`, `default_generation_settings.n_ctx` (one slot's window: the server's `-c` shared
  among its parallel slots), or the top-level `n_ctx` of older servers. llama.cpp serves one model whatever the name.
- `ollama_show`: `POST /api/show`. Ollama cuts a prompt longer than its window silently, so what counts is the
  effective `num_ctx`, not the model's `context_length`: the `num_ctx` of the model's parameters (its Modelfile);
  else the context the loaded model runs with (`GET /api/ps`, `context_length`); else 2048, the smallest default any
  Ollama version has used. The server's `OLLAMA_CONTEXT_LENGTH` is not visible through the API, and a guess too small
  only compacts early where one too large loses text unnoticed. That guess is provisional (asked again soon, when the
  model is likely loaded). All are capped by the model's `context_length`.
- `lm_studio_models`: `GET /api/v0/models`, the entry whose `id` is the model: its `loaded_context_length`. A model
  not loaded yet has none; it is asked again later.
- `tgi_info`: `GET /info`, `max_input_tokens` (`max_input_length` before TGI 2): the longest prompt TGI accepts, which
  binds before its `max_total_tokens`. TGI serves one model whatever the name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

MIN_WINDOW: Final = 256
"""The smallest window believed: anything smaller is not a chat model's context but a misreport."""
MAX_WINDOW: Final = 1 << 24
"""The largest window believed (16M tokens, beyond every model served today)."""
OLLAMA_DEFAULT_NUM_CTX: Final = 2048
"""The window Ollama is assumed to run a model with when nothing it reports says otherwise (see the module docs)."""

Fetch = Callable[[str, str, Mapping[str, Any] | None], Awaitable[Any]]
"""`fetch(method, path, json_body)`: the upstream's parsed JSON answer, or None when it answered anything else."""


@dataclass(frozen=True)
class Finding:
    """A window a server stated.

    :param tokens: The window in tokens.
    :param provisional: A stand-in until the server can say more (Ollama's model not loaded yet): ask again soon.
    """

    tokens: int
    provisional: bool = False


Probe = Callable[[Fetch, str], Awaitable[Finding | None]]


def plausible(value: object) -> int | None:
    """`value` when it is an integer window between `MIN_WINDOW` and `MAX_WINDOW`, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and MIN_WINDOW <= value <= MAX_WINDOW:
        return value
    return None


def _found(value: object) -> Finding | None:
    tokens = plausible(value)
    return Finding(tokens) if tokens else None


def _entry(listing: Any, model: str, key: str = "id") -> Mapping[str, Any] | None:
    """The entry of an OpenAI-style listing (`{"data": [...]}`) whose `key` is the model."""
    entries = listing.get("data") if isinstance(listing, Mapping) else None
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, Mapping) and entry.get(key) == model:
            return entry
    return None


def _field(value: Any, *path: str) -> Any:
    """`value[path[0]][path[1]]...`, or None where a level is missing or not a mapping."""
    for name in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(name)
    return value


async def openai_models(fetch: Fetch, model: str) -> Finding | None:
    """The listed model's `max_model_len` (vLLM, SGLang) or `meta.n_ctx` (llama.cpp)."""
    entry = _entry(await fetch("GET", "/v1/models", None), model)
    if entry is None:
        return None
    return _found(entry.get("max_model_len")) or _found(_field(entry, "meta", "n_ctx"))


async def llama_cpp_props(fetch: Fetch, model: str) -> Finding | None:
    """llama.cpp's slot window from `/props`."""
    props = await fetch("GET", "/props", None)
    return _found(_field(props, "default_generation_settings", "n_ctx")) or _found(_field(props, "n_ctx"))


async def ollama_show(fetch: Fetch, model: str) -> Finding | None:
    """The window Ollama runs the model with: its `num_ctx`, else its loaded context, else the smallest default."""
    shown = await fetch("POST", "/api/show", {"model": model})
    if not isinstance(shown, Mapping) or not ("model_info" in shown or "modelfile" in shown):
        return None
    info = shown.get("model_info")
    lengths = (
        (value for key, value in info.items() if key.endswith(".context_length")) if isinstance(info, Mapping) else ()
    )
    limit = next(filter(None, map(plausible, lengths)), MAX_WINDOW)
    num_ctx = _num_ctx(shown.get("parameters"))
    if num_ctx is not None:
        return Finding(min(num_ctx, limit))
    loaded = _loaded_context(await fetch("GET", "/api/ps", None), model)
    if loaded is not None:
        return Finding(min(loaded, limit))
    return Finding(min(OLLAMA_DEFAULT_NUM_CTX, limit), provisional=True)


def _num_ctx(parameters: object) -> int | None:
    """`num_ctx` from Ollama's parameter text (one `name value` per line), when plausible."""
    for line in parameters.splitlines() if isinstance(parameters, str) else ():
        name, _, value = line.strip().partition(" ")
        if name == "num_ctx" and value.strip().isdigit():
            return plausible(int(value.strip()))
    return None


def _loaded_context(running: Any, model: str) -> int | None:
    """The `context_length` Ollama's `/api/ps` reports for the model, when it is loaded."""
    models = _field(running, "models")
    names = {model, f"{model}:latest"}
    for entry in models if isinstance(models, list) else ():
        if isinstance(entry, Mapping) and (entry.get("name") in names or entry.get("model") in names):
            return plausible(entry.get("context_length"))
    return None


async def lm_studio_models(fetch: Fetch, model: str) -> Finding | None:
    """LM Studio's `loaded_context_length` of the listed model."""
    entry = _entry(await fetch("GET", "/api/v0/models", None), model)
    return _found(entry.get("loaded_context_length")) if entry is not None else None


async def tgi_info(fetch: Fetch, model: str) -> Finding | None:
    """TGI's prompt limit from `/info`."""
    info = await fetch("GET", "/info", None)
    return _found(_field(info, "max_input_tokens")) or _found(_field(info, "max_input_length"))


PROBES: Final[Mapping[str, Probe]] = {
    "openai_models": openai_models,
    "llama_cpp_props": llama_cpp_props,
    "ollama_show": ollama_show,
    "lm_studio_models": lm_studio_models,
    "tgi_info": tgi_info,
}
"""Every probe by the name `window_probes` uses."""
