"""A simulated upstream: a model to try the proxy against, with no provider and no network.

It speaks the three wire formats the proxy compacts, as their providers do, JSON and streamed: OpenAI's chat
completions and Responses API (`openai_upstream`, `responses_server`) and Anthropic's Messages API
(`anthropic_upstream`). It counts prompt tokens itself, reports usage with cached tokens the way each provider's
prompt cache would, calls the tools it is offered, and refuses a prompt over its context window with the provider's
own error body. `compaction-proxy simulate` serves it alone and `compaction-proxy demo` puts the proxy in front of
it; the tests run the proxy against the same servers, recording what it forwarded and scripting failures
(`scripted`).

Its counting is deliberately its own (it shares only the engine's shipped tiktoken encodings), so the proxy's
estimates are checked against a separately written implementation of the providers' published rules. Nothing on the
request path imports it (an import-linter contract).
"""
