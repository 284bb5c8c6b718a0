"""The Responses API (`/v1/responses`): its items mapped onto the engine, and its requests parsed."""
