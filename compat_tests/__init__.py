"""Compatibility tests: the real openai and cohere SDKs and plain HTTP against a live `posy serve`."""
