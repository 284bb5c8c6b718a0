"""Chat-completion handling between the HTTP server and the engine: what to forward, and what to remember after."""
