"""Window discovery: the context window a model is served with, asked of the upstream itself (see `service`)."""
