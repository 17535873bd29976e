"""LLM backends: the interface (base) and the built-in OpenAI-compatible backend."""
