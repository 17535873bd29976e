"""Test doubles that are real implementations of our seams.

* :mod:`.scripted` — ``ScriptedModel``, an LLM backend you enqueue replies into;
* :mod:`.openai_server` — ``FakeOpenAIServer``, a local OpenAI-compatible HTTP
  server speaking the real SSE wire format (needs the ``testing`` extra).

``MemoryTransport`` moved to :mod:`agentik.transports.testing`; :mod:`.transport`
is its deprecated alias.
"""
