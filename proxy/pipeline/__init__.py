"""The conversation pipeline: the format-neutral decision for each request, and what is learned from its answer."""
