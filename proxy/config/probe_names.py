"""The names of the ways the upstream can be asked about a model (`window_probes`, `count_probes`)."""

from __future__ import annotations

from typing import Final

WINDOW_PROBES: Final = ("openai_models", "llama_cpp_props", "ollama_show", "lm_studio_models", "tgi_info")
"""Every way `proxy.discovery` can ask the upstream for a model's window; all of them run by default."""

COUNT_PROBES: Final = ("llama_cpp_template", "vllm_tokenize", "responses_input_tokens", "anthropic_count_tokens")
"""Every way the upstream can be asked for a request's exact token count (`proxy.discovery.tokenize`)."""
DEFAULT_COUNT_PROBES: Final = COUNT_PROBES[:2]
"""The ones asked by default: OpenAI's `responses_input_tokens` is a billed API call, so it is opt-in."""


def known_names(value: list[str], known: tuple[str, ...], what: str) -> list[str]:
    """The names stripped and deduplicated, in order; `ValueError` naming any that is not in `known`."""
    names = [name.strip() for name in value]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; known: {', '.join(known)}")
    return list(dict.fromkeys(names))
