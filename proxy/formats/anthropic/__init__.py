"""Anthropic's Messages API (`POST /v1/messages`) as a wire format: its messages and blocks on the engine, its rules.

`blocks` maps messages and their content blocks onto the engine's messages and a plan's output back; `request`
parses a body; `rules` holds what the API enforces (thinking bound to its prefix, at most four cache breakpoints);
`answers` reads usage, replies and overflow errors; `tokens` counts what the engine cannot (tools, images,
documents) and knows the Claude models' windows; `summary` builds the summary call and the read tool.
"""
