"""The first minute: `compaction-proxy simulate` and `compaction-proxy demo`, on the simulated upstream.

`simulate` serves the simulated model (`proxy.simulator`) alone, for a proxy started with `serve --upstream`.
`demo` starts the model and the proxy in front of it on loopback, drives a long tool-using agent through the proxy
while printing what happens turn by turn (`view`), then leaves both running for the user's own client.
"""
