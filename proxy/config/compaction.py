"""Settings of the compaction itself: when, to what size, with which strategies, for which windows."""

from __future__ import annotations

from typing import Final

from pydantic import BaseModel, Field, field_validator, model_validator

from proxy.config.kinds import ClientCompaction, Mode, ProviderState
from proxy.config.probe_names import COUNT_PROBES, DEFAULT_COUNT_PROBES, WINDOW_PROBES, known_names
from proxy.engine.strategies.offload import ToolResultOffload
from proxy.engine.strategies.registry import DEFAULT_CHAIN
from proxy.engine.strategies.user_message_window import DEFAULT_USER_TEXT_SHARE

DEFAULT_STRATEGIES: Final = DEFAULT_CHAIN


class CompactionSettings(BaseModel):
    """The trigger, the target, the chain and the windows."""

    mode: Mode = Field(
        default=Mode.ENFORCE,
        description="`enforce` rewrites oversized conversations; `observe` only decides and reports, changing nothing.",
    )
    compact_at: float = Field(
        default=0.7,
        gt=0,
        le=1,
        description=(
            "Trigger: compact a chat request once its estimated prompt reaches this fraction of the model's context"
            " window (0 < compact_to < compact_at <= 1)."
        ),
    )
    compact_to: float = Field(
        default=0.4,
        gt=0,
        lt=1,
        description="Target: a compaction shrinks the messages to this fraction of the window, minus tools/template.",
    )
    strategies: list[str] = Field(
        default_factory=lambda: list(DEFAULT_STRATEGIES),
        description=(
            "The compaction chain, in order; each runs only while the conversation is still over the target."
            " Names are those of the engine's strategies (`provider_compaction`, `duplicate_results`,"
            " `superseded_results`, `json_minify`, `tool_result_pruning`, `user_message_window`, `sliding_window`,"
            " `summarization`, `middle_out`) and `tool_result_offloading`, which places offloading (with `offload` on,"
            " it runs before the first lossy step unless named). From the environment: a JSON list or comma-separated"
            " names."
        ),
    )
    user_text_share: float = Field(
        default=DEFAULT_USER_TEXT_SHARE,
        ge=0,
        le=1,
        description=(
            "The share of the compaction target the user's own earlier messages may take (`user_message_window`):"
            " within it they are kept byte for byte while old assistant messages and tool results go; past it the"
            " longest are cut middle-out, then the middle ones removed before the opening and the latest. 0 keeps"
            " none of them, 1 lets them take the whole target. Provisional default, to be set by the recall benchmark."
        ),
    )
    superseded_tools: list[str] = Field(
        default_factory=list,
        description=(
            "Tools whose older results `superseded_results` replaces with a pointer to a newer call with the same"
            " arguments (idempotent reads such as `read_file`: only you know which tools are). Empty: none. From the"
            " environment: a JSON list or comma-separated names."
        ),
    )
    context_windows: dict[str, int] = Field(
        default_factory=dict,
        description=(
            "Per-model context windows in tokens, overriding the shipped table: `{model name: tokens}`. From the"
            " environment: a JSON object or `model=tokens,model=tokens`."
        ),
    )
    default_context_window: int | None = Field(
        default=None,
        gt=0,
        description="Window assumed for models neither table knows; None leaves such requests uncompacted.",
    )
    # Window discovery: asking the upstream itself for the window of a model no setting names (`proxy.discovery`).
    window_probes: list[str] = Field(
        default_factory=lambda: list(WINDOW_PROBES),
        description=(
            "Which endpoints of the upstream are asked for a model's context window when neither the request, an"
            " overflow error nor `context_windows` gives it: `openai_models` (`GET /v1/models`: vLLM and SGLang"
            " `max_model_len`, llama.cpp `meta.n_ctx`), `llama_cpp_props` (`GET /props`), `ollama_show`"
            " (`POST /api/show`, the effective `num_ctx`), `lm_studio_models` (`GET /api/v0/models`, the loaded"
            " context length), `tgi_info` (`GET /info`, the input limit). `[]` asks nothing. Each is asked once per"
            " model, then rarely; the window found ranks above the shipped table. Unset, every probe runs, except"
            " against OpenAI's own API (`api.openai.com`), which serves none of them. From the environment: a JSON"
            " list or comma-separated names."
        ),
    )
    discovery_timeout: float = Field(
        default=0.5,
        ge=0,
        description=(
            "Seconds the first request for a model whose window nothing else gives (or only `default_context_window`)"
            " waits for the upstream's answer; past that it proceeds with what is known, and the answer serves later"
            " requests. Requests for models the shipped table knows never wait: their answer only serves later ones."
        ),
    )
    discovery_refresh_seconds: float = Field(
        default=3600.0,
        gt=0,
        description=(
            "Seconds a discovered window is used before the upstream is asked again, in the background (a server"
            " restarted with another context size is noticed within this time)."
        ),
    )
    probe_runs_per_tenant_per_minute: int = Field(
        default=10,
        ge=0,
        description=(
            "Probe runs one tenant may start per minute: a window discovery run (5 to 7 requests to the upstream,"
            " one per probe) for a model the proxy has not asked about lately, or an exact count by a method of"
            " `count_probes` that has never answered. A request past it is served with what is known (no"
            " discovered window, a local count) and counted in `compaction_proxy_probe_runs_refused_total`."
        ),
    )
    probe_runs_per_minute: int = Field(
        default=60,
        ge=0,
        description=(
            "Probe runs all tenants together may start per minute (see `probe_runs_per_tenant_per_minute`): a"
            " client cycling model names or credentials cannot multiply its request rate to the upstream."
        ),
    )
    # Exact counting: asking the upstream for a request's token count under its own tokenizer and template.
    count_probes: list[str] = Field(
        default_factory=lambda: list(DEFAULT_COUNT_PROBES),
        description=(
            "Which endpoints of the upstream are asked for a request's exact prompt tokens:"
            " `llama_cpp_template` (llama.cpp's `/apply-template` and `/tokenize`), `vllm_tokenize` (vLLM's and"
            " SGLang's `/tokenize` with messages), `responses_input_tokens` (OpenAI's `/v1/responses/input_tokens`,"
            " for the Responses API; opt-in), `anthropic_count_tokens` (the Messages API's `/v1/messages/count_tokens`;"
            " opt-in). `[]` asks nothing. The first that answers is used from then on; one"
            " that does not is asked again only after a back-off. Unset, the first two run, except against OpenAI's"
            " own API (`api.openai.com`). From the environment: a JSON list or comma-separated names."
        ),
    )
    exact_count_timeout: float = Field(
        default=0.05,
        ge=0,
        description=(
            "Seconds a request waits for the upstream's exact count of its prompt (asked only where no usage report"
            " covers most of it); past that it is measured with the calibrated local count, and the answer, when it"
            " comes, serves the conversation's next request."
        ),
    )
    conversation_header: str = Field(
        default="X-Conversation-Id",
        min_length=1,
        description="Request header that names a conversation explicitly: used for metrics, logs and grouping.",
    )
    max_messages: int = Field(
        default=100_000,
        gt=0,
        description=(
            "Most messages a chat request may hold; one with more is answered 400 (`too_many_messages`) and never"
            " forwarded, so no single request can make the proxy's work unbounded."
        ),
    )
    max_content_parts: int = Field(
        default=100_000,
        gt=0,
        description=(
            "Most content parts (entries of list contents: text, images, files, audio) a chat request may hold over all"
            " its messages; more is answered 400 (`too_many_content_parts`)."
        ),
    )
    provider_state: ProviderState = Field(
        default=ProviderState.OFF,
        description=(
            "For Responses API conversations kept at the provider (`previous_response_id` or `conversation`), whose"
            " history the proxy cannot rewrite: what to ask of the provider once its reported usage for the chain"
            " passes `compact_at` and the client set no context management of its own. `off` forwards as sent;"
            " `compaction` adds `context_management` (server-side compaction at `compact_at` of the window, for"
            " upstreams that offer it, such as OpenAI); `truncation` adds `truncation: auto`."
        ),
    )
    client_compaction: ClientCompaction = Field(
        default=ClientCompaction.AUTO,
        description=(
            "For a client that compacts its conversation itself (Codex CLI, Claude Code): `auto` defers to it where"
            " it is recognized (its headers, its own compaction request, compaction items or `context_management` in"
            " the request), compacting only as the safety net, when a request would not fit the window (and after an"
            " overflow); `defer` does so for every client; `ignore` compacts at `compact_at` regardless. A request"
            " may say the same with `X-Compaction-Client: auto | defer | ignore`."
        ),
    )
    rewrite_memory: bool = Field(
        default=True,
        description=(
            "Remember each compaction and replay it byte for byte on later turns of the same conversation, so the"
            " upstream's prompt cache keeps hitting and a summary is paid for once. Off: every request is compacted"
            " afresh from what the client sent (only useful to measure what the memory saves)."
        ),
    )
    offload: bool = Field(
        default=True,
        description=(
            "Offload older large tool results instead of pruning them: the proxy keeps the full text in its state"
            " store, leaves a reference with a digest of what it held, and answers the model's calls to its read tool"
            " (`compaction_proxy_read_result`) itself. Off (or `X-Compaction-Offload: off` on a request): plain"
            " pruning."
        ),
    )
    offload_read_rounds: int = Field(
        default=4,
        ge=1,
        description=(
            "Most rounds of reads the proxy answers for one request; the round after the last is asked with"
            " `tool_choice: none`, so the model answers with what it has read."
        ),
    )
    offload_reads_per_answer: int = Field(
        default=8,
        ge=1,
        description=(
            "Most reads of distinct offloaded results the proxy answers from one model answer; further read calls"
            " (and repeats of a reference) are left out of the conversation, as client calls made with reads are."
        ),
    )
    offload_max_tools: int = Field(
        default=128,
        ge=1,
        description=(
            "The read tool is offered only to requests with fewer tools than this (OpenAI accepts 128): a request"
            " at the limit, or with its own tool named `compaction_proxy_read_result`, is pruned instead of offloaded."
        ),
    )

    @field_validator("strategies")
    @classmethod
    def _check_strategies(cls, value: list[str]) -> list[str]:
        names = [name.strip() for name in value]
        if any(not name for name in names):
            raise ValueError("strategy names must not be empty")
        if len(set(names)) != len(names):
            raise ValueError("a strategy may appear only once")
        return names

    @model_validator(mode="after")
    def _check_offloading_named(self) -> CompactionSettings:
        if ToolResultOffload.name in self.strategies and not self.offload:
            raise ValueError(
                f"strategies names {ToolResultOffload.name} but offload is off; remove it from strategies, or turn"
                " offload on"
            )
        return self

    @field_validator("window_probes")
    @classmethod
    def _check_probes(cls, value: list[str]) -> list[str]:
        return known_names(value, WINDOW_PROBES, "window probes")

    @field_validator("count_probes")
    @classmethod
    def _check_count_probes(cls, value: list[str]) -> list[str]:
        return known_names(value, COUNT_PROBES, "count probes")

    @field_validator("context_windows")
    @classmethod
    def _check_windows(cls, value: dict[str, int]) -> dict[str, int]:
        for model, tokens in value.items():
            if tokens <= 0:
                raise ValueError(f"window of {model!r} must be a positive number of tokens")
        return value
