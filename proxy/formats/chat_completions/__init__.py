"""OpenAI's Chat Completions API (`/v1/chat/completions`, and Azure's deployment paths): `messages`."""
