"""The wire formats the proxy understands, one folder each, mapped onto the engine's messages and back."""
